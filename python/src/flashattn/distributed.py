"""Context-parallel attention for PyTorch: one attention whose sequence is split over the ranks of
a torch.distributed process group (one process per GPU, launched with torchrun).

    import torch.distributed as dist
    from flashattn import distributed as fcp

    dist.init_process_group("nccl")                      # torchrun sets RANK, WORLD_SIZE, ...
    rank, world = dist.get_rank(), dist.get_world_size()
    q_local = fcp.shard(q, rank, world)                  # (batch, seqlen / world, heads, head_dim)
    ...
    out_local = fcp.attention(q_local, k_local, v_local, causal=True)   # autograd: dq, dk, dv local
    out = fcp.unshard(out_local)                         # the whole sequence, where it is needed

The algorithm is the C++ library's (flashattn::dist, include/flashattn/distributed.hpp), one
implementation for C++ and Python:

- ``strategy="ring"``: K/V shards travel around the ring while the current block is computed, the
  partial outputs merge through their LSE; the backward sends dK/dV around the same way.
- ``strategy="all_to_all"`` (head-parallel, DeepSpeed-Ulysses): all-to-all to head-sharded full
  sequences, single-GPU attention, all-to-all back. heads_q must be a multiple of the ranks; with
  GQA and fewer K/V heads than ranks, each K/V head goes to every rank whose query heads read it,
  and their dK/dV are summed on the way back.

Sharding (both strategies): "zigzag". The sequence is cut into 2 * world chunks; rank r holds
chunks r and 2 * world - 1 - r, so that every rank does the same causal work. :func:`shard`
cuts a global tensor that way, :func:`unshard` gathers the shards back. Packed variable-length
batches (``cu_seqlens``) cut every document the same way (each document's length must be a
multiple of 2 * world): the rank's tensor holds chunk r of every document, then chunk
2 * world - 1 - r of every document. ``cu_seqlens`` passed to :func:`attention` are the GLOBAL
offsets, the same on every rank; ``max_seqlen`` the global longest document.

Transport: CUDA tensors go over an NCCL communicator that is built once per process group from
it (rank 0 makes the NCCL unique id, broadcast through the group; needs a build with NCCL,
:func:`flashattn.built_with_nccl`); K/V move on their own stream, ordered by CUDA events, so the
transfer of the next block hides under the current one. CPU tensors go through the group's own
point-to-point operations (gloo): the same algorithm on flashattn's CPU backend, for tests.

Features across ranks: f16/bf16 (and f32 on the CPU), causal, GQA/MQA, softcap, softmax_scale,
variable length (ring only). Not across ranks: sliding windows, dropout, ALiBi, KV cache.
"""
import atexit
from typing import Optional

import torch
import torch.distributed as dist
from torch import Tensor

from . import _C

__all__ = ["attention", "communicator", "shard", "unshard", "zigzag_rows", "TorchTransport"]


# ---- sharding ----------------------------------------------------------------------------------


def zigzag_rows(length: int, rank: int, world: int, cu_seqlens: Optional[Tensor] = None) -> Tensor:
    """The global sequence indices (int64) rank `rank` of `world` holds, in its local order.

    Fixed length: `length` is the global sequence length, a multiple of 2 * world. Variable
    length: `cu_seqlens` (global offsets) gives the documents and `length` is ignored.
    """
    chunks = 2 * world
    if not 0 <= rank < world:
        raise ValueError(f"rank: expected 0 <= rank < world ({world}), got {rank}")
    if cu_seqlens is None:
        if length % chunks:
            raise ValueError(f"length: expected a multiple of 2 * world ({chunks}), got {length}")
        c = length // chunks
        return torch.cat([torch.arange(i * c, (i + 1) * c) for i in (rank, chunks - 1 - rank)])
    offsets = [int(x) for x in cu_seqlens.cpu()]
    parts = []
    for chunk in (rank, chunks - 1 - rank):
        for start, end in zip(offsets[:-1], offsets[1:]):
            if (end - start) % chunks:
                raise ValueError(f"cu_seqlens: expected document lengths that are multiples of 2 * world "
                                 f"({chunks}), got {end - start}")
            c = (end - start) // chunks
            parts.append(torch.arange(start + chunk * c, start + (chunk + 1) * c))
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)


def shard(x: Tensor, rank: int, world: int, dim: int = 1, cu_seqlens: Optional[Tensor] = None) -> Tensor:
    """Rank `rank`'s zigzag shard of `x` (the whole sequence along `dim`: 1 for (batch, seqlen,
    heads, head_dim), 0 for packed (total, heads, head_dim) with `cu_seqlens`)."""
    rows = zigzag_rows(x.shape[dim], rank, world, cu_seqlens).to(x.device)
    return x.index_select(dim, rows).contiguous()


def unshard(x: Tensor, group=None, dim: int = 1, cu_seqlens: Optional[Tensor] = None) -> Tensor:
    """The whole sequence from every rank's shard `x` (an all_gather over `group`): the inverse of
    :func:`shard`. Every rank gets the result."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x.contiguous(), group=group)
    shape = list(x.shape)
    shape[dim] *= world
    full = x.new_empty(shape)
    for r, part in enumerate(parts):
        full.index_copy_(dim, zigzag_rows(shape[dim], r, world, cu_seqlens).to(x.device), part)
    return full


# ---- transports --------------------------------------------------------------------------------


class TorchTransport:
    """flashattn's transport over a torch.distributed group's point-to-point operations (used for
    CPU tensors, with gloo). The library hands it lists of memoryviews over its buffers."""

    def __init__(self, group=None):
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)

    def _peer(self, r: int) -> int:
        return r if self.group is None else dist.get_global_rank(self.group, r)

    @staticmethod
    def _tensors(views):
        return [torch.frombuffer(m, dtype=torch.uint8) for m in views if len(m)]

    def exchange_start(self, send, to, recv, src):
        send_t, recv_t = self._tensors(send), self._tensors(recv)
        ops = [dist.P2POp(dist.isend, t, self._peer(to), self.group) for t in send_t]
        ops += [dist.P2POp(dist.irecv, t, self._peer(src), self.group) for t in recv_t]
        works = dist.batch_isend_irecv(ops) if ops else []
        return works, send_t, recv_t  # the tensors stay alive until the works are done

    def exchange_finish(self, handle):
        for work in handle[0]:
            work.wait()

    def all_to_all(self, send, recv):
        ops = []
        for j in range(self.size):
            if j == self.rank:
                recv[j][:] = send[j]
                continue
            ops += [dist.P2POp(dist.isend, t, self._peer(j), self.group) for t in self._tensors([send[j]])]
            ops += [dist.P2POp(dist.irecv, t, self._peer(j), self.group) for t in self._tensors([recv[j]])]
        for work in dist.batch_isend_irecv(ops) if ops else []:
            work.wait()


_communicators: dict = {}
# NCCL communicators go before the CUDA runtime does at exit.
atexit.register(_communicators.clear)


def communicator(group=None, device: Optional[torch.device] = None):
    """The flashattn communicator of `group` (default: the default group) for tensors on `device`,
    made on first use (a collective call: every rank of the group must make it) and kept.

    CUDA: an NCCL communicator over the group's ranks (rank 0's NCCL unique id is broadcast
    through the group). CPU: :class:`TorchTransport` over the group.
    """
    device = torch.device("cpu") if device is None else torch.device(device)
    key = (group, device.type, device.index)
    comm = _communicators.get(key)
    if comm is not None:
        return comm
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if device.type == "cuda":
        if not _C.built_with_nccl():
            raise NotImplementedError("device: CUDA tensors need a flashattn build with NCCL (built_with_nccl() is "
                                      "False: the CUDA toolkit's NCCL was not found when it was built)")
        index = torch.cuda.current_device() if device.index is None else device.index
        uid = [_C.nccl_unique_id() if rank == 0 else None]
        src = 0 if group is None else dist.get_global_rank(group, 0)
        on = torch.device("cuda", index) if dist.get_backend(group) == "nccl" else None
        dist.broadcast_object_list(uid, src=src, group=group, device=on)
        comm = _C.nccl_communicator(uid[0], rank, world, index)
    elif device.type == "cpu":
        comm = _C.python_communicator(TorchTransport(group), rank, world)
    else:
        raise TypeError(f"device: expected cuda or cpu tensors, got {device.type}")
    _communicators[key] = comm
    return comm


# ---- attention ---------------------------------------------------------------------------------


def _empty_lse(q: Tensor, varlen: bool) -> Tensor:
    """The rank's LSE, rows padded to 4 floats (16-byte aligned rows for the GPU kernels)."""
    n = q.shape[0] if varlen else q.shape[1]
    shape = (q.shape[1],) if varlen else (q.shape[0], q.shape[2])
    return q.new_empty(shape + ((n + 3) // 4 * 4,), dtype=torch.float32)[..., :n]


class _ContextParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, comm, options, deterministic):
        out = torch.empty_like(q)
        lse = _empty_lse(q, options["cu_seqlens_q"] is not None)
        _C.dist_forward(q, k, v, out, lse, comm, **options)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.comm, ctx.options, ctx.deterministic = comm, options, deterministic
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        dout = dout if dout.stride(-1) == 1 else dout.contiguous()
        _C.dist_backward(dout, q, k, v, out, lse, dq, dk, dv, ctx.comm, deterministic=ctx.deterministic,
                         **ctx.options)
        return dq, dk, dv, None, None, None


def attention(q: Tensor, k: Tensor, v: Tensor, group=None, *, causal: bool = False,
              softmax_scale: Optional[float] = None, softcap: float = 0.0, strategy: str = "ring",
              cu_seqlens: Optional[Tensor] = None, max_seqlen: Optional[int] = None,
              deterministic: bool = False, return_lse: bool = False, comm=None,
              sm_margin: int = 0):  # fmt: skip
    """Attention over the whole sequence whose zigzag shards the ranks of `group` hold.

    q: this rank's shard, (batch, seqlen_local, nheads, headdim), or packed (total_local, nheads,
    headdim) with `cu_seqlens` (int32 GLOBAL offsets, on q's device) and `max_seqlen` (the global
    longest document); k, v: (..., nheads_k, headdim), nheads a multiple of nheads_k. Returns
    this rank's shard of the output (and its LSE, float32 (batch, nheads, seqlen_local) or
    (nheads, total_local), with return_lse=True). Differentiable in q, k, v: the gradients are
    this rank's shards. Every rank of the group must call it with the same shapes and options.
    strategy: "ring" or "all_to_all". comm: a flashattn communicator to use instead of the group's
    (:func:`communicator`, or ``flashattn._C.python_communicator`` over any transport).
    sm_margin: SMs that the attention kernels leave free while a ring transfer is in flight, so
    that NCCL's kernels start at once instead of after them (Hopper's persistent kernels fill
    every SM; docs/DESIGN.md, context parallelism, has the measurement).
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if strategy not in ("ring", "all_to_all"):
        raise ValueError(f"strategy: expected 'ring' or 'all_to_all', got {strategy!r}")
    if comm is None:
        comm = communicator(group, q.device)
    varlen = cu_seqlens is not None
    if varlen and max_seqlen is None:
        raise ValueError("max_seqlen: expected the global longest document with cu_seqlens, got None")
    options = dict(strategy=strategy, softmax_scale=None if softmax_scale is None else float(softmax_scale),
                   causal=bool(causal), softcap=float(softcap), cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens,
                   max_seqlen_q=int(max_seqlen or 0), max_seqlen_k=int(max_seqlen or 0), sm_margin=int(sm_margin))
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    out, lse = _ContextParallel.apply(q, k, v, comm, options, bool(deterministic))
    return (out, lse) if return_lse else out
