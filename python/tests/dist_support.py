"""Shared by the context-parallel tests: the zigzag rows of a rank (NumPy, no torch), and an
in-process transport over queues for flashattn._C.python_communicator (ranks as threads)."""
import queue
import threading

import numpy as np


def zigzag_rows(world, rank, chunk=None, documents=None):
    """Global sequence rows rank `rank` holds: fixed chunks of `chunk` rows, or the documents'."""
    chunks = 2 * world
    rows = []
    for c in (rank, chunks - 1 - rank):
        if documents is None:
            rows.extend(range(c * chunk, (c + 1) * chunk))
        else:
            start = 0
            for length in documents:
                part = length // chunks
                rows.extend(range(start + c * part, start + (c + 1) * part))
                start += length
    return np.array(rows, dtype=np.int64)


class QueueTransport:
    """exchange_start / exchange_finish / all_to_all between threads of this process."""

    def __init__(self, boxes, rank, world):
        self.boxes, self.rank, self.world = boxes, rank, world

    @staticmethod
    def make(world):
        boxes = {(i, j): queue.Queue() for i in range(world) for j in range(world)}
        return [QueueTransport(boxes, r, world) for r in range(world)]

    def exchange_start(self, send, to, recv, src):
        self.boxes[(self.rank, to)].put([bytes(m) for m in send])
        return src, recv

    def exchange_finish(self, handle):
        src, recv = handle
        message = self.boxes[(src, self.rank)].get(timeout=120)
        assert [len(m) for m in message] == [len(m) for m in recv], "message sizes"
        for m, data in zip(recv, message):
            m[:] = data

    def all_to_all(self, send, recv):
        for j in range(self.world):
            self.boxes[(self.rank, j)].put([bytes(send[j])])
        for j in range(self.world):
            recv[j][:] = self.boxes[(j, self.rank)].get(timeout=120)[0]


def run_ranks(world, fn):
    """Runs fn(rank) on `world` threads; re-raises the first error."""
    errors = [None] * world

    def body(r):
        try:
            fn(r)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors[r] = e

    threads = [threading.Thread(target=body, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for e in errors:
        if e is not None:
            raise e
