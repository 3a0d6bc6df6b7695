#!/usr/bin/env python3
"""Sustained clocks and power of our forward and cuDNN's, each run back to back for a few seconds.

Under a long run an H100 reaches its power cap and lowers its SM clock; a kernel that does more
per cycle but draws more power per cycle gains nothing there. This probe runs each
implementation alone for `--seconds` on one shape, samples nvidia-smi every 50 ms and prints
per implementation: ms per call, TFLOP/s, the median SM clock and power over the busy samples,
the throttle reasons seen, and TFLOP/s per GHz of SM clock (work per cycle).

Ours runs through `sm90_forward_smoke one` (tests/gpu; its shapes: batch 16384 / n, heads
2048 / d, bf16, (b, n, h, d) layout) with the library's choice of kernel family; the peer through
PyTorch SDPA on the same shape in its own (b, h, n, d) layout: cuDNN by default.
FLASHATTN_PROBE_FAMILY=sm80 forces our sm80 family (FLASHATTN_CUDA_FAMILY) and makes PyTorch's
FlashAttention-2 the peer, as issue #3 compares them.

Usage: power_probe.py SMOKE_BINARY [d:n:causal ...]   e.g. power_probe.py build/tests/gpu/sm90_forward_smoke 128:8192:0
"""
import os
import re
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

QUERY = "clocks.sm,power.draw,clocks_event_reasons.active"
FAMILY = os.environ.get("FLASHATTN_PROBE_FAMILY", "")
RATE = 300e12 if FAMILY == "sm80" else 600e12  # FLOP/s assumed when choosing the repetitions
PEER, PEER_BACKEND = ("fa2", SDPBackend.FLASH_ATTENTION) if FAMILY == "sm80" else ("cudnn", SDPBackend.CUDNN_ATTENTION)


class Sampler:
    """nvidia-smi every 50 ms in the background; busy() keeps the samples above 300 W."""

    def __enter__(self):
        self.proc = subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits", "-lms", "50"],
                                     stdout=subprocess.PIPE, text=True)
        return self

    def __exit__(self, *exc):
        self.proc.terminate()
        self.lines = self.proc.communicate()[0].splitlines()

    def busy(self):
        rows = [[field.strip() for field in line.split(",")] for line in self.lines]
        rows = [r for r in rows if len(r) == 3 and r[1] not in ("", "[N/A]") and float(r[1]) > 300]
        return [float(r[0]) for r in rows], [float(r[1]) for r in rows], sorted({r[2] for r in rows})


def flops(d, n, causal):
    b, h = 16384 // n, 2048 // d
    return 4.0 * b * h * n * n * d * (0.5 if causal else 1.0)


def repetitions(d, n, causal, seconds):
    return max(10, int(seconds / (flops(d, n, causal) / RATE)))


def run_ours(smoke, d, n, causal, seconds):
    env = dict(os.environ, FLASHATTN_CUDA_FAMILY=FAMILY) if FAMILY else None
    out = subprocess.run([smoke, "one", str(d), str(n), str(int(causal)), str(repetitions(d, n, causal, seconds))],
                         capture_output=True, text=True, check=True, env=env).stdout
    found = re.search(r"([\d.]+) ms per call", out)
    if not found:
        sys.exit(f"{smoke} printed no time per call (an older build?): {out.strip()}")
    return float(found.group(1))


def run_peer(d, n, causal, seconds):
    b, h = 16384 // n, 2048 // d
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    reps = repetitions(d, n, causal, seconds)
    with sdpa_kernel(PEER_BACKEND):
        for _ in range(5):
            F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        torch.cuda.synchronize()
        start = time.time()
        for _ in range(reps):
            F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        torch.cuda.synchronize()
    return (time.time() - start) * 1e3 / reps


def main():
    smoke = sys.argv[1]
    shapes = sys.argv[2:] or ["128:8192:0"]
    print(f"{'impl':6} {'d':>4} {'n':>6} {'causal':6} {'ms':>8} {'TFLOP/s':>8} {'MHz':>6} {'W':>5} {'TF/GHz':>7}  reasons")
    for shape in shapes:
        d, n, causal = (int(x) for x in shape.split(":"))
        causal = bool(causal)
        for impl in ("ours", PEER):
            time.sleep(2)  # let the clocks recover between runs
            with Sampler() as s:
                ms = run_ours(smoke, d, n, causal, 4.0) if impl == "ours" else run_peer(d, n, causal, 4.0)
            clocks, power, reasons = s.busy()
            tflops = flops(d, n, causal) / ms * 1e-9
            mhz = statistics.median(clocks) if clocks else float("nan")
            watts = statistics.median(power) if power else float("nan")
            print(f"{impl:6} {d:4} {n:6} {'yes' if causal else 'no':6} {ms:8.3f} {tflops:8.1f} {mhz:6.0f} {watts:5.0f} "
                  f"{tflops / mhz * 1e3:7.1f}  {' '.join(reasons)} ({len(clocks)} samples)", flush=True)


if __name__ == "__main__":
    main()
