#!/usr/bin/env python3
"""How much of a forward call the last, partly filled wave of tiles costs: TFLOP/s of ours and of
cuDNN (PyTorch SDPA) on shapes that differ only in the number of heads, chosen so that our tile
count lands just past, in the middle of and exactly on a whole number of waves of 132 CTAs.
If the last wave's idle CTAs cost time, our TFLOP/s rises with the fill of the last wave.

Each implementation runs back to back (`--reps` calls between CUDA events, the median of
`--rounds` rounds, ours and cuDNN alternated). Ours on (b, n, h, d), SDPA on (b, h, n, d).

Usage: wave_probe.py d:n:b:h[:causal] ...
"""
import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashattn.torch import flash_attn_func


def back_to_back_ms(fn, reps):
    fn()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) / reps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shapes", nargs="+")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    print(f"{'shape':<26} {'ours TF/s':>10} {'cudnn TF/s':>11} {'ratio':>6}")
    for shape in args.shapes:
        parts = [int(x) for x in shape.split(":")]
        d, n, b, h = parts[:4]
        causal = len(parts) > 4 and parts[4] != 0
        q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
        flops = 4.0 * b * h * n * n * d * (0.5 if causal else 1.0)
        ours, peer = [], []
        for _ in range(args.rounds):
            ours.append(back_to_back_ms(lambda: flash_attn_func(q, k, v, causal=causal), args.reps))
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                peer.append(back_to_back_ms(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal),
                                            args.reps))
        o, c = statistics.median(ours), statistics.median(peer)
        print(f"d{d} n{n} b{b} h{h} {'causal' if causal else '':<6} {flops / o * 1e-9:10.1f} {flops / c * 1e-9:11.1f}"
              f" {c / o:6.3f}", flush=True)


if __name__ == "__main__":
    main()
