"""The FP8 forward's accuracy, measured on the kernel: RMSE of the output against float64 attention
on flash-attn 3's outlier data (python/benchmarks/fp8_accuracy.py: outlier_normal), for the bf16
kernel and for e4m3 inputs quantized by flashattn.fp8 with one scale per tensor, one per (sequence,
KV head), one per block of 128 rows of Q and K (block quantization; V per (sequence, KV head)),
and the last two after incoherent processing (the Hadamard transform with random signs on Q and
K). Also quantize_e4m3's time (the library's kernels, CUDA events) at 16k tokens x hidden 2048,
the same shapes as the speed table.

Usage: python fp8_kernel_accuracy.py [--dim 128] [--seqlens 1024,4096,8192,16384] [--heads 4]
                                     [--causal] [--json PATH]
"""
import argparse
import datetime
import json

import torch

from fp8_accuracy import outlier_normal
from flashattn.fp8 import hadamard_signs, quantize_e4m3
from flashattn.torch import flash_attn_func


def reference(q, k, v, causal, chunk=2048):
    """float64 attention, (1, n, h, d), query rows in chunks (the n x n scores of one chunk at a time)."""
    n, scale = q.shape[1], q.shape[-1] ** -0.5
    out = torch.empty_like(q)
    for start in range(0, n, chunk):
        s = torch.einsum("bqhd,bkhd->bhqk", q[:, start:start + chunk], k) * scale
        if causal:
            i = torch.arange(start, min(start + chunk, n), device=q.device)[:, None]
            s = s.masked_fill(torch.arange(n, device=q.device)[None, :] > i, float("-inf"))
        out[:, start:start + chunk] = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, dim=-1), v)
    return out


def rmse(a, b):
    return float((a.double() - b).pow(2).mean().sqrt())


def time_ms(fn, iters=20):
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--seqlens", default="1024,4096,8192,16384")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json")
    args = ap.parse_args()
    d, h = args.dim, args.heads
    signs = hadamard_signs(d, seed=args.seed, device="cuda")
    rows = []
    for n in (int(x) for x in args.seqlens.split(",")):
        g = torch.Generator().manual_seed(args.seed + n)
        q, k, v = (outlier_normal((1, n, h, d), g, "cuda") for _ in range(3))
        ref = reference(q, k, v, args.causal)
        row = {"seqlen": n, "heads": h, "dim": d, "causal": args.causal}
        row["bf16"] = rmse(flash_attn_func(*(t.to(torch.bfloat16) for t in (q, k, v)), causal=args.causal), ref)
        for name, scales, transform in (("fp8_per_tensor", "tensor", None), ("fp8_per_head", "head", None),
                                        ("fp8_per_block", "block", None), ("fp8_per_head_hadamard", "head", signs),
                                        ("fp8_per_block_hadamard", "block", signs)):  # fmt: skip
            # The float64 draws in float32 (quantize_e4m3's widest input; e4m3 rounds far coarser).
            per_tensor, per_block = scales == "tensor", scales == "block"
            (q8, qd), (k8, kd), (v8, vd) = (
                quantize_e4m3(q.float(), signs=transform, per_tensor=per_tensor, per_block=per_block),
                quantize_e4m3(k.float(), signs=transform, per_tensor=per_tensor, per_block=per_block),
                quantize_e4m3(v.float(), per_tensor=per_tensor))  # fmt: skip
            out = flash_attn_func(q8, k8, v8, causal=args.causal, q_descale=qd, k_descale=kd, v_descale=vd)
            row[name] = rmse(out, ref)
        row["per_tensor_over_per_head_hadamard"] = row["fp8_per_tensor"] / row["fp8_per_head_hadamard"]
        row["per_tensor_over_per_block_hadamard"] = row["fp8_per_tensor"] / row["fp8_per_block_hadamard"]
        rows.append(row)
        print(json.dumps(row), flush=True)
        del q, k, v, ref
    # The helper's time on the speed table's inputs (16k tokens x hidden 2048: 4 x 4096 x 16 x 128).
    x = torch.randn(4, 4096, 2048 // d, d, device="cuda", dtype=torch.bfloat16)
    timing = {
        "shape": list(x.shape),
        "quantize_ms": time_ms(lambda: quantize_e4m3(x)),
        "quantize_hadamard_ms": time_ms(lambda: quantize_e4m3(x, signs=signs)),
        "quantize_per_block_hadamard_ms": time_ms(lambda: quantize_e4m3(x, signs=signs, per_block=True)),
    }
    print(json.dumps(timing), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tool": "fp8_kernel_accuracy.py", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                       "device": torch.cuda.get_device_name(), "rows": rows, "helper_timing": timing}, f, indent=1)


if __name__ == "__main__":
    main()
