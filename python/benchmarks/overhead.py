"""Per-call host overhead of flashattn's Python layers against calling the C++ API directly.

On a problem so small that the kernel is negligible, times the host side of CALLS calls issued
back to back (no synchronization inside the timed loop, and few enough launches that the CUDA
launch queue never fills, so the host does not wait for the GPU); median of REPEATS:

  direct C++           flashattn::forward called from a C++ loop (_C._seconds_per_direct_forward)
  flashattn.forward    the DLPack-level binding, outputs preallocated (torch fast path)
  ... via __dlpack__   the same through DLPack, as other frameworks go (what the fast path avoids)
  flash_attn_func      flashattn.torch in eager mode, allocating its outputs
  custom op            torch.ops.flashattn.forward through the dispatcher (the torch.compile path)
  forward + backward   one training step's calls: eager path and custom-op path
  F.sdpa               PyTorch's own attention on the same problem, for scale

Overheads are against `direct C++` writing the same outputs (with or without LSE). Runs on CUDA
when the build has kernels for the problem, else on the CPU.
Usage: python overhead.py [--json PATH]
"""
import argparse
import json
import platform
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import flashattn
from flashattn import _C
from flashattn.torch import flash_attn_func

CALLS = 100  # per repeat: a training step launches ~5 kernels, the launch queue holds ~1000
REPEATS = 50


class DLPackOnly:
    """Exposes a tensor through DLPack alone, as a non-torch framework would."""

    def __init__(self, tensor):
        self.tensor = tensor

    def __dlpack__(self, **kwargs):
        return self.tensor.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.tensor.__dlpack_device__()


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def seconds_per_call(fn, device):
    """Median over repeats of the host time of CALLS back-to-back calls, per call."""
    for _ in range(20):
        fn()
    sync(device)
    samples = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        for _ in range(CALLS):
            fn()
        samples.append((time.perf_counter() - start) / CALLS)
        sync(device)
    return statistics.median(samples)


def pick_device(shape):
    if torch.cuda.is_available() and flashattn.built_with_cuda():
        q = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        try:
            flash_attn_func(q, q, q)
            torch.cuda.synchronize()
            return "cuda", torch.bfloat16, None
        except NotImplementedError as e:
            return "cpu", torch.float32, f"CUDA not measured: {e}"
    return "cpu", torch.float32, "CUDA not measured: no GPU or no CUDA build"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()

    shape = (1, 16, 1, 64)  # batch, seqlen, heads, head_dim: the kernel is negligible
    device, dtype, note = pick_device(shape)
    q, k, v = (torch.randn(shape, device=device, dtype=dtype) for _ in range(3))
    out, lse = torch.empty_like(q), torch.empty(1, 1, 16, device=device, dtype=torch.float32)
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    dq, dk, dv = (DLPackOnly(x) for x in (q, k, v))
    dout, dlse = DLPackOnly(out), DLPackOnly(lse)
    op = torch.ops.flashattn.forward
    op_args = (None, None, 0, 0, None, False, -1, -1, 0.0, False)
    grad = torch.randn_like(q)

    def direct(lse):
        return statistics.median(
            _C._seconds_per_direct_forward(CALLS, q, k, v, out, lse) for _ in range(REPEATS)
        )

    # (name, what to time, its baseline: the direct call with or without LSE, or none)
    candidates = [
        ("flashattn.forward (torch tensors)", lambda: _C.forward(q, k, v, out, lse), "lse"),
        ("flashattn.forward (torch tensors), no lse", lambda: _C.forward(q, k, v, out), "no lse"),
        ("flashattn.forward via __dlpack__", lambda: _C.forward(dq, dk, dv, dout, dlse), "lse"),
        ("flash_attn_func, no grad", lambda: flash_attn_func(q, k, v), "no lse"),
        ("flash_attn_func, return_attn_probs", lambda: flash_attn_func(q, k, v, return_attn_probs=True), "lse"),
        ("flash_attn_func, requires_grad", lambda: flash_attn_func(qg, kg, vg), "lse"),
        ("custom op, no grad", lambda: op(q, k, v, *op_args), "lse"),
        ("custom op, requires_grad", lambda: op(qg, kg, vg, *op_args), "lse"),
        ("flash_attn_func forward + backward", lambda: flash_attn_func(qg, kg, vg).backward(grad), None),
        ("custom op forward + backward", lambda: op(qg, kg, vg, *op_args)[0].backward(grad), None),
        ("torch.empty_like (one allocation)", lambda: torch.empty_like(q), None),
        ("F.scaled_dot_product_attention", lambda: F.scaled_dot_product_attention(q, k, v), None),
    ]
    baselines = {"lse": direct(lse), "no lse": direct(None)}
    sync(device)
    rows = [("direct C++ (flashattn::forward)", baselines["lse"], None),
            ("direct C++ (flashattn::forward), no lse", baselines["no lse"], None)]
    for name, fn, baseline in candidates:
        try:
            rows.append((name, seconds_per_call(fn, device), baseline))
        except Exception as e:  # report the rest even if one path fails
            print(f"{name}: {type(e).__name__}: {e}")
            rows.append((name, float("nan"), baseline))

    print(f"device {device} ({torch.cuda.get_device_name() if device == 'cuda' else platform.processor()}), "
          f"dtype {dtype}, shape {shape}, torch {torch.__version__}, python {platform.python_version()}")
    if note:
        print(note)
    print(f"{'call':44s} {'us/call':>9s} {'over direct':>12s}")
    for name, seconds, baseline in rows:
        over = f"{(seconds - baselines[baseline]) * 1e6:+12.2f}" if baseline else ""
        print(f"{name:44s} {seconds * 1e6:9.2f} {over}")
    if args.json:
        record = {
            "device": device,
            "device_name": torch.cuda.get_device_name() if device == "cuda" else platform.processor(),
            "dtype": str(dtype),
            "shape": shape,
            "torch": torch.__version__,
            "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d"),
            "note": note,
            "us_per_call": {name: seconds * 1e6 for name, seconds, _ in rows},
            "us_over_direct": {
                name: (seconds - baselines[baseline]) * 1e6 for name, seconds, baseline in rows if baseline
            },
        }
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
