"""Context-parallel attention (flashattn.distributed) against one GPU running the whole sequence.

    torchrun --nproc-per-node 2 python/benchmarks/context_parallel.py [--seqlens 131072,262144]
        [--heads 32/32,32/8] [--strategies ring,all_to_all] [--reps 3] [--json PATH] [--no-single]

bf16, causal, d = 128, batch 1. For every sequence length and heads (query/KV) it times, with CUDA
events after one warm-up, the median of --reps calls, every rank at once (a barrier before each):
  - 1 GPU: flashattn.torch.flash_attn_func on the whole sequence (forward; backward through
    autograd), on every rank's GPU, rank 0 reported;
  - each strategy on the zigzag shards: forward, and backward (through autograd);
  - each strategy over a communicator that transfers nothing between ranks
    (flashattn._C._null_communicator: each received buffer gets a local copy of the buffer sent in
    its place, so the kernels compute on real data): the compute alone, plus those copies. Exposed communication = time with NCCL - time without (the NCCL time not
    hidden under compute); the transfer's own time is estimated from the bytes moved.
Scaling efficiency = 1-GPU time / (world x context-parallel time); >= 1 would be superlinear.
The context-parallel time is the slowest rank's.

PyTorch's own context_parallel (the anchor) is not run here: run
/work/shared/bench/torch_cp_anchor.py (or a copy) right after this, in the same torchrun
allocation, and compare the two printouts. Runtime: estimated at about 2-3 minutes on two H200s at the
defaults (not yet measured).
"""
import argparse
import datetime
import json
import os
import subprocess

import torch
import torch.distributed as dist

import flashattn
from flashattn import _C
import flashattn.distributed as fcp
from flashattn.torch import flash_attn_func


def timed(fn, reps):
    """Median milliseconds of fn() over reps calls after a warm-up; the max over ranks."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    t = torch.tensor(sorted(times)[len(times) // 2], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def fwd_bwd(run, inputs, dout, reps):
    """(forward ms, backward ms) of out = run(*inputs) and out.backward(dout)."""
    xs = [x.detach().requires_grad_() for x in inputs]
    fwd = timed(lambda: run(*xs), reps)
    out = run(*xs)
    bwd = timed(lambda: torch.autograd.grad(out, xs, dout, retain_graph=True), reps)
    return fwd, bwd


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seqlens", default="131072,262144")
    p.add_argument("--heads", default="32/32,32/8", help="query/kv heads, comma-separated")
    p.add_argument("--strategies", default="ring,all_to_all")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--sm-margins", default="0",
                   help="ring only: also run with these sm_margin values (SMs left free for NCCL), "
                        "reported as ring_margin<m>")
    p.add_argument("--json", help="write the results here (rank 0)")
    p.add_argument("--no-single", action="store_true",
                   help="skip the 1-GPU run (1M tokens: minutes, and more memory than an 80 GB GPU has)")
    args = p.parse_args()

    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank, world = dist.get_rank(), dist.get_world_size()
    d, dtype = 128, torch.bfloat16
    comm = fcp.communicator(None, torch.device("cuda", local))
    null = _C._null_communicator(rank, world, True)
    rows = []
    for n in [int(x) for x in args.seqlens.split(",")]:
        for heads in args.heads.split(","):
            hq, hk = (int(x) for x in heads.split("/"))
            gen = torch.Generator(device="cuda").manual_seed(0)
            q = torch.randn(1, n, hq, d, device="cuda", dtype=dtype, generator=gen)
            k, v = (torch.randn(1, n, hk, d, device="cuda", dtype=dtype, generator=gen) for _ in range(2))
            dout = torch.randn_like(q)
            one = (float("nan"), float("nan")) if args.no_single else fwd_bwd(
                lambda a, b, c: flash_attn_func(a, b, c, causal=True), (q, k, v), dout, args.reps)
            shards = [fcp.shard(x, rank, world) for x in (q, k, v, dout)]
            del q, k, v, dout
            torch.cuda.empty_cache()
            # Bytes one rank sends per ring step: its K/V shard (forward); K/V plus float32 dK/dV (backward).
            kv_bytes = 2 * (n // world) * hk * d * 2
            row = dict(seqlen=n, heads_q=hq, heads_kv=hk, one_gpu_fwd_ms=one[0], one_gpu_bwd_ms=one[1],
                       ring_step_bytes_fwd=kv_bytes, ring_step_bytes_bwd=3 * kv_bytes)
            variants = []
            for strategy in args.strategies.split(","):
                if strategy == "all_to_all" and hq % world:
                    continue
                margins = [int(m) for m in args.sm_margins.split(",")] if strategy == "ring" else [0]
                variants += [(strategy if m == 0 else f"{strategy}_margin{m}", strategy, m) for m in margins]
            for strategy, kind, margin in variants:
                for name, c in (("", comm), ("_compute_only", null)):
                    run = lambda a, b, c_, s=kind, cm=c, m=margin: fcp.attention(  # noqa: E731
                        a, b, c_, causal=True, strategy=s, comm=cm, sm_margin=m)
                    f, b = fwd_bwd(run, shards[:3], shards[3], args.reps)
                    row[f"{strategy}{name}_fwd_ms"], row[f"{strategy}{name}_bwd_ms"] = f, b
                for direction in ("fwd", "bwd"):
                    t = row[f"{strategy}_{direction}_ms"]
                    row[f"{strategy}_{direction}_efficiency"] = row[f"one_gpu_{direction}_ms"] / (world * t)
                    row[f"{strategy}_{direction}_exposed_comm_ms"] = t - row[f"{strategy}_compute_only_{direction}_ms"]
            rows.append(row)
            if rank == 0:
                line = f"n={n} heads {hq}/{hk}: 1 GPU fwd {one[0]:.1f} bwd {one[1]:.1f} ms"
                for strategy, _, _ in variants:
                    if f"{strategy}_fwd_ms" in row:
                        line += (f" | {strategy} fwd {row[f'{strategy}_fwd_ms']:.1f} bwd {row[f'{strategy}_bwd_ms']:.1f} ms"
                                 f" eff {row[f'{strategy}_fwd_efficiency']:.2f}/{row[f'{strategy}_bwd_efficiency']:.2f}"
                                 f" exposed comm {row[f'{strategy}_fwd_exposed_comm_ms']:.1f}/"
                                 f"{row[f'{strategy}_bwd_exposed_comm_ms']:.1f} ms")
                print(line, flush=True)
            del shards
            torch.cuda.empty_cache()
    if rank == 0 and args.json:
        try:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                    cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
        except OSError:
            commit = ""
        record = dict(benchmark="context_parallel", date=datetime.datetime.now(datetime.timezone.utc).isoformat(),
                      device=torch.cuda.get_device_name(), world=world, commit=commit, dtype="bf16", causal=True,
                      head_dim=d, flashattn=flashattn.__version__, torch=torch.__version__, rows=rows)
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
