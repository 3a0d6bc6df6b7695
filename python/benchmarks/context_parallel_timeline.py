"""Kernel timeline of one context-parallel forward + backward on every rank (torch.profiler).

    torchrun --nproc-per-node 2 python/benchmarks/context_parallel_timeline.py OUT_PREFIX
        [--seqlen 131072] [--heads 32/32] [--strategy ring] [--compute-only]
    python python/benchmarks/context_parallel_timeline.py --summarize OUT_PREFIX_rank0.kernels.json ...

bf16, causal, d = 128, batch 1. After one untimed call, each rank profiles one forward and
backward and writes OUT_PREFIX_rank<r>.kernels.json: [start us, duration us, stream, name] per
GPU kernel, copy and memset, the start relative to the rank's first one. It then prints the
timeline with consecutive kernels of one kind merged (attention, NCCL, element-wise, merges) and
the time per kind. --compute-only runs over flashattn._C._null_communicator (no transfer between
ranks). The ranks' clocks are not aligned: the profiler starts at a slightly different time on
each, so compare durations across ranks, not start times.
"""
import argparse
import json
import os


def kind(name):
    n = name.lower()
    if "nccl" in n:
        return "NCCL"
    if "backward_kernel" in n:
        return "backward"
    if "forward_kernel" in n:
        return "forward"
    if "merge" in n:
        return "merge"
    if "elementwise" in n:
        return "element-wise"
    if "memcpy" in n:
        return "memcpy"
    return name.split("(")[0][:40]


def summarize(path):
    rows = json.load(open(path))
    print(f"== {os.path.basename(path)}: {len(rows)} kernels")
    busy, segments = {}, []
    for start, dur, stream, name in rows:
        k = kind(name)
        busy[k] = busy.get(k, 0.0) + dur
        last = segments[-1] if segments else None
        if last and last["stream"] == stream and last["kind"] == k and start - last["end"] < 50:
            last["end"], last["count"], last["busy"] = start + dur, last["count"] + 1, last["busy"] + dur
        else:
            segments.append(dict(start=start, end=start + dur, stream=stream, kind=k, count=1, busy=dur))
    span = max(r[0] + r[1] for r in rows)
    print(f"  span {span / 1e3:.2f} ms; ms by kind:",
          {k: round(v / 1e3, 2) for k, v in sorted(busy.items(), key=lambda x: -x[1])})
    for s in segments:
        if s["busy"] > 300 or s["kind"] == "NCCL":
            print(f"  {s['start'] / 1e3:9.2f} ms +{(s['end'] - s['start']) / 1e3:8.2f} ms  stream {s['stream']}  "
                  f"{s['kind']:<12} x{s['count']} ({s['busy'] / 1e3:.2f} ms of kernels)")


def profile(args):
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile as torch_profile

    import flashattn.distributed as fcp
    from flashattn import _C

    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank, world = dist.get_rank(), dist.get_world_size()
    hq, hk = (int(x) for x in args.heads.split("/"))
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(1, args.seqlen, hq, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(1, args.seqlen, hk, 128, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    dout = torch.randn_like(q)
    ql, kl, vl = (fcp.shard(x, rank, world).requires_grad_() for x in (q, k, v))
    dl = fcp.shard(dout, rank, world)
    del q, k, v, dout
    comm = _C._null_communicator(rank, world, True) if args.compute_only else None

    def step():
        out = fcp.attention(ql, kl, vl, causal=True, strategy=args.strategy, comm=comm)
        torch.autograd.grad(out, (ql, kl, vl), dl)

    step()
    torch.cuda.synchronize()
    dist.barrier()
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    trace = f"{args.out}_rank{rank}.trace.json"
    prof.export_chrome_trace(trace)
    events = [e for e in json.load(open(trace))["traceEvents"]
              if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and e.get("dur") is not None]
    os.remove(trace)
    t0 = min(e["ts"] for e in events)
    rows = sorted([round(e["ts"] - t0, 1), round(e["dur"], 1), e["args"].get("stream"), e["name"][:90]] for e in events)
    path = f"{args.out}_rank{rank}.kernels.json"
    json.dump(rows, open(path, "w"))
    for r in range(world):
        dist.barrier()
        if r == rank:
            summarize(path)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out", nargs="+", help="output prefix (profiling), or kernel JSON files (--summarize)")
    p.add_argument("--seqlen", type=int, default=131072)
    p.add_argument("--heads", default="32/32", help="query/kv heads")
    p.add_argument("--strategy", default="ring", choices=["ring", "all_to_all"])
    p.add_argument("--compute-only", action="store_true", help="over the null communicator")
    p.add_argument("--summarize", action="store_true", help="only print the timelines of the given JSON files")
    args = p.parse_args()
    if args.summarize:
        for path in args.out:
            summarize(path)
    else:
        args.out = args.out[0]
        profile(args)


if __name__ == "__main__":
    main()
