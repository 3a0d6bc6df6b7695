"""flashattn's context-parallel attention through the Python bindings without torch: every rank a
thread, the transfers through a Python transport object (flashattn._C.python_communicator, the
path the torch.distributed transport takes), on the CPU backend; outputs, LSE and gradients
against one single-process call on the whole sequence."""
import numpy as np
import pytest

import flashattn
from flashattn import _C
from dist_support import QueueTransport, run_ranks, zigzag_rows
from numpy_reference import rel_err

CASES = [
    # world, strategy, causal, heads_q, heads_kv, documents (None: fixed length), softcap
    (2, "ring", True, 4, 2, None, 0.0),
    (2, "ring", False, 4, 4, None, 0.0),
    (3, "ring", True, 6, 1, None, 4.0),
    (4, "ring", True, 4, 2, [8, 16, 0, 24], 0.0),
    (2, "ring", False, 2, 1, [4, 12], 0.0),
    (2, "all_to_all", True, 4, 2, None, 0.0),
    (4, "all_to_all", True, 8, 2, None, 0.0),  # heads_kv < ranks: K/V heads on two ranks each
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}ranks_{c[1]}_{'causal' if c[2] else 'full'}_h{c[3]}-{c[4]}"
                         f"{'_varlen' if c[5] else ''}{'_softcap' if c[6] else ''}")
def test_matches_single_process(case):
    world, strategy, causal, hq, hk, documents, softcap = case
    d, chunk, batch = 16, 5, 2
    rng = np.random.default_rng(world * 7 + hq)
    varlen = documents is not None
    n = sum(documents) if varlen else 2 * world * chunk
    lead = (n,) if varlen else (batch, n)
    q, k, v, dout = (rng.standard_normal(lead + (h, d)).astype(np.float32) for h in (hq, hk, hk, hq))
    options = dict(causal=causal, softcap=softcap)
    if varlen:
        cu = np.concatenate([[0], np.cumsum(documents)]).astype(np.int32)
        options.update(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(documents), max_seqlen_k=max(documents))
    lse_shape = (hq, n) if varlen else (batch, hq, n)
    out, lse = np.empty_like(q), np.empty(lse_shape, np.float32)
    flashattn.forward(q, k, v, out, lse, **options)
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    flashattn.backward(dout, q, k, v, out, lse, dq, dk, dv, **options)

    seq, lse_seq = (0, 1) if varlen else (1, 2)
    transports = QueueTransport.make(world)
    results = [None] * world

    def rank(r):
        rows = zigzag_rows(world, r, chunk, documents)
        lq, lk, lv, ldo = (np.ascontiguousarray(x.take(rows, axis=seq)) for x in (q, k, v, dout))
        comm = _C.python_communicator(transports[r], r, world)
        lout, llse = np.full_like(lq, np.nan), np.full(lse_shape[:lse_seq] + (len(rows),), np.nan, np.float32)
        _C.dist_forward(lq, lk, lv, lout, llse, comm, strategy=strategy, **options)
        ldq, ldk, ldv = np.full_like(lq, np.nan), np.full_like(lk, np.nan), np.full_like(lv, np.nan)
        _C.dist_backward(ldo, lq, lk, lv, lout, llse, ldq, ldk, ldv, comm, strategy=strategy, **options)
        results[r] = rows, lout, llse, ldq, ldk, ldv

    run_ranks(world, rank)
    for rows, lout, llse, ldq, ldk, ldv in results:
        assert rel_err(lout, out.take(rows, axis=seq)) < 2e-5
        np.testing.assert_allclose(llse, lse.take(rows, axis=lse_seq), rtol=1e-5, atol=1e-5)
        for got, ref in ((ldq, dq), (ldk, dk), (ldv, dv)):
            assert rel_err(got, ref.take(rows, axis=seq)) < 2e-5


def test_transport_errors_become_runtime_errors():
    class Broken(QueueTransport):
        def exchange_start(self, *args):
            raise OSError("link down")

    q = np.zeros((1, 4, 2, 16), np.float32)
    comm = _C.python_communicator(Broken({}, 0, 2), 0, 2)
    with pytest.raises(RuntimeError, match="link down"):
        _C.dist_forward(q, q, q, np.empty_like(q), None, comm)


def test_rejects_bad_arguments():
    with pytest.raises(TypeError, match="transport"):
        _C.python_communicator(object(), 0, 2)
    with pytest.raises(ValueError, match="rank"):
        _C.python_communicator(QueueTransport({}, 0, 1), 1, 1)
    comm = _C.python_communicator(QueueTransport.make(1)[0], 0, 1)
    q = np.zeros((1, 4, 2, 16), np.float32)
    with pytest.raises(ValueError, match="strategy"):
        _C.dist_forward(q, q, q, np.empty_like(q), None, comm, strategy="tree")
    with pytest.raises(NotImplementedError, match="window_size"):
        _C.dist_forward(q, q, q, np.empty_like(q), None, comm, window_size=(2, 0))
    odd = np.zeros((1, 5, 2, 16), np.float32)
    with pytest.raises(ValueError, match="q"):
        _C.dist_forward(odd, odd, odd, np.empty_like(odd), None, comm)
    assert flashattn.built_with_nccl() in (True, False)
    if not flashattn.built_with_nccl():
        with pytest.raises(NotImplementedError, match="NCCL"):
            _C.nccl_unique_id()
