"""flashattn.distributed on GPUs over NCCL, launched by torchrun (skipped otherwise):

    torchrun --nproc-per-node 2 -m pytest -q python/tests/test_distributed_gpu.py

Every rank computes the whole sequence on its own GPU with flashattn.torch (the single-GPU result)
and a float32 reference, and checks its shard of the context-parallel output and gradients: the
error against the reference at most twice the single-GPU one's plus 1e-3 (bf16 tolerance)."""
import math
import os

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import flashattn  # noqa: E402

WORLD = int(os.environ.get("WORLD_SIZE", "1"))
pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and flashattn.built_with_cuda() and WORLD >= 2),
    reason="needs torchrun with 2+ GPUs and a CUDA build of flashattn",
)

import flashattn.distributed as fcp  # noqa: E402
from flashattn.torch import flash_attn_func, flash_attn_varlen_func  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def group():
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    if not dist.is_initialized():
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    yield
    dist.barrier()


def reference(q, k, v, causal, softcap, cu=None):
    """float32 attention (batch, seqlen, heads, d), GQA, causal, softcap; per document with cu."""
    if cu is not None:
        outs = [reference(q[None, a:b], k[None, a:b], v[None, a:b], causal, softcap)[0]
                for a, b in zip(cu[:-1].tolist(), cu[1:].tolist())]
        return torch.cat(outs)
    g = q.shape[2] // k.shape[2]
    qf, kf, vf = q.float().transpose(1, 2), k.float().repeat_interleave(g, 2).transpose(1, 2), v.float().repeat_interleave(g, 2).transpose(1, 2)
    s = qf @ kf.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return (s.softmax(-1) @ vf).transpose(1, 2)


def rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


# strategy, causal, heads_q, heads_kv, chunk (rows per zigzag chunk), documents (x 2 * world), softcap, dtype
CASES = [
    ("ring", True, 8, 8, 512, None, 0.0, torch.bfloat16),
    ("ring", True, 8, 2, 1000, None, 0.0, torch.bfloat16),
    ("ring", False, 8, 2, 384, None, 0.0, torch.bfloat16),
    ("ring", True, 8, 2, 0, [300, 64, 1000, 1], 0.0, torch.bfloat16),
    ("ring", True, 8, 8, 256, None, 30.0, torch.bfloat16),
    ("ring", True, 8, 8, 256, None, 0.0, torch.float16),
    ("all_to_all", True, 8, 2, 512, None, 0.0, torch.bfloat16),
    ("all_to_all", False, 8, 8, 300, None, 0.0, torch.bfloat16),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}_{'causal' if c[1] else 'full'}_h{c[2]}-{c[3]}_"
                         f"{'varlen' if c[5] else c[4]}{'_softcap' if c[6] else ''}_{str(c[7])[6:]}")
def test_matches_single_gpu(case):
    strategy, causal, hq, hk, chunk, documents, softcap, dtype = case
    rank, d, dev = dist.get_rank(), 128, torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(1234)
    varlen = documents is not None
    if varlen:
        lengths = [2 * WORLD * m for m in documents]
        n = sum(lengths)
        cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device=dev)
        shape = lambda h: (n, h, d)  # noqa: E731
    else:
        n, cu = 2 * WORLD * chunk, None
        shape = lambda h: (1, n, h, d)  # noqa: E731
    q, k, v, dout = (torch.randn(shape(h), generator=gen, device=dev, dtype=dtype) for h in (hq, hk, hk, hq))

    def grads(fn, inputs):
        xs = [x.clone().requires_grad_() for x in inputs]
        out = fn(*xs)
        out.backward(dout.float() if out.dtype == torch.float32 else dout)
        return [out.detach()] + [x.grad for x in xs]

    try:
        if varlen:
            m = max(lengths)
            single = grads(lambda a, b, c: flash_attn_varlen_func(a, b, c, cu, cu, m, m, causal=causal, softcap=softcap), (q, k, v))
        else:
            single = grads(lambda a, b, c: flash_attn_func(a, b, c, causal=causal, softcap=softcap), (q, k, v))
    except NotImplementedError as e:
        pytest.skip(f"not in this build: {e}")
    ref = grads(lambda a, b, c: reference(a, b, c, causal, softcap, cu), (q.float(), k.float(), v.float()))

    dim = 0 if varlen else 1
    local = [fcp.shard(x, rank, WORLD, dim=dim, cu_seqlens=cu).requires_grad_() for x in (q, k, v)]
    lout = fcp.attention(*local, causal=causal, softcap=softcap, strategy=strategy, cu_seqlens=cu,
                         max_seqlen=max(lengths) if varlen else None)
    lout.backward(fcp.shard(dout, rank, WORLD, dim=dim, cu_seqlens=cu))
    got = [lout.detach()] + [x.grad for x in local]
    # The collective (unshard) first, the assertions after it: a rank that failed early would
    # leave the others waiting in the all_gather.
    gathered = fcp.unshard(lout.detach(), dim=dim, cu_seqlens=cu)
    failures = []
    for name, g, s, r in zip(("out", "dq", "dk", "dv"), got, single, ref):
        r_local = fcp.shard(r, rank, WORLD, dim=dim, cu_seqlens=cu)
        s_local = fcp.shard(s, rank, WORLD, dim=dim, cu_seqlens=cu)
        bound = 2 * rel_err(s_local, r_local) + 1e-3
        if not rel_err(g, r_local) <= bound:
            failures.append(f"{name} on rank {rank}: {rel_err(g, r_local):.2e} > {bound:.2e}")
    assert not failures, "; ".join(failures)
    torch.testing.assert_close(gathered, single[0], atol=2e-2, rtol=2e-2)


def test_stream_order_without_synchronization():
    """On a side stream, with nothing synchronized in between: the result is the same."""
    rank = dist.get_rank()
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(7)
    q, k, v = (torch.randn(1, 2 * WORLD * 2048, 8, 128, generator=gen, device=dev, dtype=torch.bfloat16) for _ in range(3))
    local = [fcp.shard(x, rank, WORLD) for x in (q, k, v)]
    expected = fcp.attention(*local, causal=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = [fcp.attention(*local, causal=True) for _ in range(3)]
    torch.cuda.current_stream().wait_stream(side)
    for g in got:
        torch.testing.assert_close(g, expected, atol=0, rtol=0)
