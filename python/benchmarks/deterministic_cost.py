"""What deterministic mode costs: flashattn's backward with deterministic=False and True, in ONE
process on one GPU, on the training shapes of side_by_side.py (16k tokens, hidden 2048, bf16).

Timings are triton.testing.do_bench medians of the backward alone (autograd.grad of a saved
forward), in --rounds interleaved rounds. Also checks that two deterministic backwards give
bitwise equal dQ, dK, dV.

Usage: python deterministic_cost.py [--dims 64,128] [--lens 2048,8192] [--json PATH]
"""
import argparse
import datetime
import json
import statistics

import torch
from triton.testing import do_bench

from flashattn.torch import flash_attn_func


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--lens", default="2048,8192")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    info = {"device": torch.cuda.get_device_name(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "method": "python/benchmarks/deterministic_cost.py: do_bench medians of the backward, "
                      f"median of {args.rounds} interleaved rounds"}
    print(json.dumps(info), flush=True)
    rows = []
    for d in (int(x) for x in args.dims.split(",")):
        for n in (int(x) for x in args.lens.split(",")):
            for causal in (False, True):
                b, h = 16384 // n, 2048 // d
                flops = 2.5 * 4 * b * h * n * n * d / (2 if causal else 1)
                q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                           for _ in range(3))
                do = torch.randn_like(q)
                outs = {det: flash_attn_func(q, k, v, causal=causal, deterministic=det) for det in (False, True)}
                grads = lambda det: torch.autograd.grad(outs[det], (q, k, v), do, retain_graph=True)
                samples = {False: [], True: []}
                for _ in range(args.rounds):
                    for det in (False, True):
                        samples[det].append(do_bench(lambda: grads(det), warmup=25, rep=100, return_mode="median"))
                first, second = grads(True), grads(True)
                row = {"d": d, "n": n, "causal": causal,
                       "default_tflops": flops / statistics.median(samples[False]) / 1e9,
                       "deterministic_tflops": flops / statistics.median(samples[True]) / 1e9,
                       "bitwise_equal": all(torch.equal(x, y) for x, y in zip(first, second))}
                row["ratio"] = row["deterministic_tflops"] / row["default_tflops"]
                print(json.dumps(row), flush=True)
                rows.append(row)
                del q, k, v, do, outs
                torch.cuda.empty_cache()
    print("\n   d      n causal | default / deterministic TFLOP/s | ratio | bitwise equal")
    for r in rows:
        print(f"{r['d']:>4} {r['n']:>6} {str(r['causal']):>6} | {r['default_tflops']:6.0f} / "
              f"{r['deterministic_tflops']:6.0f} | {r['ratio']:.2f} | {r['bitwise_equal']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"info": info, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
