"""PyTorch's CPU F.scaled_dot_product_attention at the shapes of shapes.txt, fp32 and bf16, with
the thread count of OMP_NUM_THREADS (default: all cores): the peer of cpu_bench.

Forward: the call on inputs that require grad (so that it also keeps its LSE, as ours writes
it). Backward: torch.autograd.grad on the retained graph, i.e. the backward alone. Medians of
at least 5 runs and about 0.5 s after one warm-up, as cpu_bench times ours. Also measures
PyTorch's own fp32 accuracy against float64 at the cases cpu_check prints as magnitude30
(scores in the thousands), to put our errors there in context.

Usage: bench_torch.py shapes.txt out.json
"""
import json
import os
import sys
import time

import torch
import torch.nn.functional as F


def median_ms(fn):
    fn()
    times, total = [], 0.0
    while len(times) < 5 or (total < 0.5 and len(times) < 50):
        t0 = time.perf_counter()
        fn()
        t = time.perf_counter() - t0
        times.append(t)
        total += t
    times.sort()
    return times[len(times) // 2] * 1e3


def read_shapes(path):
    shapes = []
    for line in open(path):
        fields = line.split("#")[0].split()
        if len(fields) == 5:
            b, h, n, d, causal = map(int, fields)
            shapes.append((b, h, n, d, bool(causal)))
    return shapes


def time_shape(b, h, n, d, causal, dtype):
    gen = torch.Generator().manual_seed(1234)
    q, k, v = (torch.randn(b, h, n, d, generator=gen, dtype=torch.float32).to(dtype).requires_grad_()
               for _ in range(3))
    forward = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    fwd = median_ms(forward)
    out = forward()
    dout = torch.randn(out.shape, generator=gen, dtype=torch.float32).to(dtype)
    bwd = median_ms(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
    flops = 4.0 * b * h * n * n * d / (2 if causal else 1)
    return {"impl": "torch", "dtype": "f32" if dtype == torch.float32 else "bf16", "b": b, "h": h, "n": n, "d": d,
            "causal": causal, "threads": torch.get_num_threads(), "fwd_ms": round(fwd, 3),
            "fwd_gflops": round(flops / fwd / 1e6, 1), "bwd_ms": round(bwd, 3),
            "bwd_gflops": round(2.5 * flops / bwd / 1e6, 1)}


def fp32_accuracy(magnitude, causal):
    """||x - ref|| / ||ref|| of PyTorch's fp32 CPU attention against float64, b=1 h=2 n=128 d=64."""
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 2, 128, 64, generator=gen, dtype=torch.float64) * magnitude for _ in range(3))
    dout = torch.randn(1, 2, 128, 64, generator=gen, dtype=torch.float64)
    results = {}
    for dtype in (torch.float64, torch.float32):
        qq, kk, vv = (x.to(dtype).requires_grad_() for x in (q, k, v))
        out = F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal)
        grads = torch.autograd.grad(out, (qq, kk, vv), dout.to(dtype))
        results[dtype] = [out.detach()] + list(grads)
    err = lambda a, r: ((a.double() - r).norm() / r.norm()).item()
    names = ["out", "dq", "dk", "dv"]
    return {"kind": "fp32_accuracy", "impl": "torch", "magnitude": magnitude, "causal": causal,
            **{n: err(a, r) for n, a, r in zip(names, results[torch.float32], results[torch.float64])}}


def main():
    shapes, out_path = read_shapes(sys.argv[1]), sys.argv[2]
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", os.cpu_count())))
    rows = []
    for b, h, n, d, causal in shapes:
        for dtype in (torch.float32, torch.bfloat16):
            row = time_shape(b, h, n, d, causal, dtype)
            rows.append(row)
            print(json.dumps(row), flush=True)
    for magnitude in (1.0, 30.0):
        for causal in (False, True):
            row = fp32_accuracy(magnitude, causal)
            rows.append(row)
            print(json.dumps(row), flush=True)
    json.dump({"torch": torch.__version__, "rows": rows}, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main()
