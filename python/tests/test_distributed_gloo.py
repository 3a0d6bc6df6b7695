"""flashattn.distributed on CPU tensors over torch.distributed's gloo backend: 2, 4 and 8
processes, each rank's output and gradients (through autograd) against flashattn.torch on the
whole sequence in one process. Sizes are small: the point is the algorithm and the transport."""
import os
import socket
import tempfile

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

import flashattn.distributed as fcp  # noqa: E402
from flashattn.torch import flash_attn_func, flash_attn_varlen_func  # noqa: E402

# strategy, causal, heads_q, heads_kv, varlen, softcap, dtype
CONFIGS = [
    ("ring", True, 8, 2, False, 0.0, torch.float32),
    ("ring", False, 4, 4, False, 0.0, torch.float32),
    ("ring", True, 4, 1, False, 5.0, torch.bfloat16),
    ("ring", True, 4, 2, True, 0.0, torch.float32),
    ("all_to_all", True, 8, 2, False, 0.0, torch.float32),  # 4 and 8 ranks: heads_kv < ranks
    ("all_to_all", False, 8, 8, False, 0.0, torch.bfloat16),
]


def rel_err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def check_config(rank, world, config):
    strategy, causal, hq, hk, varlen, softcap, dtype = config
    gen = torch.Generator().manual_seed(CONFIGS.index(config) * 100 + world)  # the same on every rank
    d, chunk, batch = 32, 3, 2
    if varlen:
        documents = [2 * world * m for m in (1, 3, 0, 2)]
        n = sum(documents)
        cu = torch.tensor([0] + list(torch.tensor(documents).cumsum(0)), dtype=torch.int32)
        shape = lambda h: (n, h, d)  # noqa: E731
    else:
        n, cu = 2 * world * chunk, None
        shape = lambda h: (batch, n, h, d)  # noqa: E731
    q, k, v, dout = (torch.randn(shape(h), generator=gen).to(dtype) for h in (hq, hk, hk, hq))

    # One process, the whole sequence.
    qs, ks, vs = (x.clone().requires_grad_() for x in (q, k, v))
    if varlen:
        m = max(documents)
        out = flash_attn_varlen_func(qs, ks, vs, cu, cu, m, m, causal=causal, softcap=softcap)
    else:
        out = flash_attn_func(qs, ks, vs, causal=causal, softcap=softcap)
    out.backward(dout)

    # This rank's shards through the group.
    dim = 0 if varlen else 1
    local = [fcp.shard(x, rank, world, dim=dim, cu_seqlens=cu).requires_grad_() for x in (q, k, v)]
    lout = fcp.attention(*local, causal=causal, softcap=softcap, strategy=strategy, cu_seqlens=cu,
                         max_seqlen=max(documents) if varlen else None)
    lout.backward(fcp.shard(dout, rank, world, dim=dim, cu_seqlens=cu))
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    name = f"{config} on {world} ranks, rank {rank}"
    assert rel_err(lout.detach(), fcp.shard(out.detach(), rank, world, dim=dim, cu_seqlens=cu)) < tol, name + ": out"
    for x, full, what in zip(local, (qs, ks, vs), ("dq", "dk", "dv")):
        assert rel_err(x.grad, fcp.shard(full.grad, rank, world, dim=dim, cu_seqlens=cu)) < tol, name + ": " + what
    # unshard is shard's inverse, through the group.
    torch.testing.assert_close(fcp.unshard(lout.detach(), dim=dim, cu_seqlens=cu), out.detach(), atol=tol, rtol=tol)


def test_zigzag_rows_cover_the_sequence_once():
    for world in (1, 2, 3):
        rows = torch.cat([fcp.zigzag_rows(12 * world, r, world) for r in range(world)])
        assert sorted(rows.tolist()) == list(range(12 * world))
        assert fcp.zigzag_rows(4 * world, 0, world)[:2].tolist() == [0, 1]  # chunk 0 first
    cu = torch.tensor([0, 8, 8, 24], dtype=torch.int32)
    rows = fcp.zigzag_rows(0, 1, 2, cu)
    assert rows.tolist() == [2, 3, 12, 13, 14, 15, 4, 5, 16, 17, 18, 19]
    with pytest.raises(ValueError, match="length"):
        fcp.zigzag_rows(10, 0, 2)
    with pytest.raises(ValueError, match="cu_seqlens"):
        fcp.zigzag_rows(0, 0, 2, torch.tensor([0, 6], dtype=torch.int32))
    with pytest.raises(TypeError, match="q"):
        fcp.attention(None, None, None)


def worker(rank, world, init_file, results):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        for config in CONFIGS:
            check_config(rank, world, config)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4, 8])
def test_gloo_matches_single_process(world, tmp_path):
    import torch.multiprocessing as mp

    # Every rank raises on a mismatch; spawn re-raises the first failure here.
    mp.spawn(worker, args=(world, str(tmp_path / "init"), None), nprocs=world, join=True)
