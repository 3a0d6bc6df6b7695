"""One GPU on the whole sequence against the ring, call by call, with the SM clock and power.

    torchrun --nproc-per-node 2 python/benchmarks/context_parallel_clocks.py OUT_PREFIX [--seqlen 131072]

bf16, causal, d = 128, 32 heads, batch 1. Each of the one-GPU forward, the ring's forward, the
one-GPU backward and the ring's backward runs a few calls back to back (as
context_parallel.py times them: a barrier, CUDA events, the slower rank's time), then the same
with 1.5 s of idle before each call. nvidia-smi samples every GPU's SM clock and power every
20 ms meanwhile (rank 0 starts it). Prints, per call, its time and the mean clock and power of
each GPU over the call; writes OUT_PREFIX_calls.json and OUT_PREFIX_smi.csv. An H100 at its
700 W cap lowers its clock within a second of load, so back-to-back calls and calls after idle
run at different clocks: this shows how much of a scaling efficiency is the clock's.
"""
import argparse
import csv
import datetime
import json
import os
import subprocess
import time

import torch
import torch.distributed as dist

import flashattn.distributed as fcp
from flashattn.torch import flash_attn_func


def timed_calls(name, fn, calls, idle, log):
    fn()
    torch.cuda.synchronize()
    for c in range(calls):
        if idle:
            time.sleep(idle)
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.time()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        t1 = time.time()
        ms = torch.tensor(start.elapsed_time(end), device="cuda")
        dist.all_reduce(ms, op=dist.ReduceOp.MAX)
        log.append(dict(name=name, idle_s=idle, call=c, ms=round(ms.item(), 2), t0=t0, t1=t1))


def attach_clocks(log, smi_path):
    samples = []
    for row in csv.reader(open(smi_path)):
        try:
            t = datetime.datetime.strptime(row[0].strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()
            samples.append((t, int(row[1]), float(row[2]), float(row[3])))
        except (ValueError, IndexError):
            continue
    for entry in log:
        for gpu in sorted({s[1] for s in samples}):
            inside = [s for s in samples if s[1] == gpu and entry["t0"] <= s[0] <= entry["t1"]]
            if inside:
                entry[f"gpu{gpu}_mhz"] = round(sum(s[2] for s in inside) / len(inside))
                entry[f"gpu{gpu}_w"] = round(sum(s[3] for s in inside) / len(inside))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out", help="output prefix")
    p.add_argument("--seqlen", type=int, default=131072)
    args = p.parse_args()
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank, world = dist.get_rank(), dist.get_world_size()
    smi = None
    if rank == 0:
        smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,index,clocks.sm,power.draw",
                                "--format=csv,noheader,nounits", "-lms", "20"], stdout=open(args.out + "_smi.csv", "w"))
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, dout = (torch.randn(1, args.seqlen, 32, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
                     for _ in range(4))
    whole = [x.detach().requires_grad_() for x in (q, k, v)]
    shards = [fcp.shard(x, rank, world).detach().requires_grad_() for x in (q, k, v)]
    dshard = fcp.shard(dout, rank, world)
    out_whole = flash_attn_func(*whole, causal=True)
    out_ring = fcp.attention(*shards, causal=True)
    log = []
    for idle in (0.0, 1.5):
        timed_calls("1 GPU fwd", lambda: flash_attn_func(*whole, causal=True), 4, idle, log)
        timed_calls("ring fwd", lambda: fcp.attention(*shards, causal=True), 4, idle, log)
        timed_calls("1 GPU bwd", lambda: torch.autograd.grad(out_whole, whole, dout, retain_graph=True), 3, idle, log)
        timed_calls("ring bwd", lambda: torch.autograd.grad(out_ring, shards, dshard, retain_graph=True), 3, idle, log)
    dist.barrier()
    if smi:
        time.sleep(0.2)
        smi.terminate()
        smi.wait()
        attach_clocks(log, args.out + "_smi.csv")
        json.dump(log, open(args.out + "_calls.json", "w"), indent=1)
        for e in log:
            gpus = " | ".join(f"GPU{g} {e.get(f'gpu{g}_mhz')} MHz {e.get(f'gpu{g}_w')} W" for g in range(world))
            print(f"{e['name']:<10} idle {e['idle_s']:.1f} s  call {e['call']}  {e['ms']:8.2f} ms | {gpus}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
