"""The numerics an FP8 (e4m3) attention forward would have, emulated with PyTorch against float64:
per-tensor scales, block quantization (one scale per block of rows and head), and block
quantization after incoherent processing (Q and K times the same random orthogonal Hadamard
transform, which leaves QK^T unchanged), beside the bf16 path our kernels take today.

The data is FlashAttention-3's accuracy test: standard normal Q, K, V with 0.1% of the entries drawn
with 10x the standard deviation (outliers). The emulation follows the kernel design of
docs/kernels/fp8-forward.md: Q, K, V rounded to e4m3 after dividing by their scale; S = QK^T
accumulated in fp32 and descaled; softmax in fp32 with the row maximum subtracted; P rounded to e4m3
as it is (its entries are at most 1) for O = PV, the row sums taken from P before the rounding; each
key block's PV descaled by its V scale; O rounded to bf16. The bf16 path: bf16 inputs, fp32 S and softmax, P
rounded to bf16 for PV.

No FP8 kernel is built yet: this measures the schemes the kernel would implement, on the CPU or a
GPU, so that the choice between them is made from numbers. Reported: RMSE of the output against
float64 attention on the unrounded inputs, and each scheme's ratio to per-tensor FP8.

Usage: python fp8_accuracy.py [--batch 2] [--heads 8] [--seqlen 1024] [--dims 64,128,256]
                              [--block 128] [--seed 0] [--device cpu] [--variants] [--json PATH]
"""
import argparse
import datetime
import json
import math

import torch

E4M3_MAX = 448.0


def outlier_normal(shape, generator, device):
    """N(0, 1) with 0.1% of the entries N(0, 10^2): FlashAttention-3's test data."""
    x = torch.randn(shape, generator=generator, dtype=torch.float64)
    outliers = torch.rand(shape, generator=generator, dtype=torch.float64) < 1e-3
    x = torch.where(outliers, 10.0 * x, x)
    return x.to(device)


def hadamard(d, generator, device):
    """A random orthogonal transform H diag(signs) / sqrt(d) (d a power of two)."""
    assert d & (d - 1) == 0, "the Hadamard transform needs a power-of-two head dim"
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < d:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    signs = torch.randint(0, 2, (d,), generator=generator).to(torch.float64) * 2 - 1
    return (h * signs / math.sqrt(d)).to(device)


def quantize(x, block):
    """x (b, n, h, d) in float64 -> (e4m3 values as float32, scale per (b, row block, h)). block 0:
    one scale for the tensor."""
    b, n, h, d = x.shape
    if block == 0:
        amax = x.abs().amax().clamp_min(1e-12)
        scale = (amax / E4M3_MAX).reshape(1, 1, 1, 1)
        return (x / scale).float().to(torch.float8_e4m3fn).float(), scale
    blocks = (n + block - 1) // block
    padded = torch.nn.functional.pad(x, (0, 0, 0, 0, 0, blocks * block - n))
    amax = padded.reshape(b, blocks, block, h, d).abs().amax(dim=(2, 4)).clamp_min(1e-12)  # (b, blocks, h)
    scale = (amax / E4M3_MAX).repeat_interleave(block, dim=1)[:, :n].unsqueeze(-1)  # (b, n, h, 1)
    return (x / scale).float().to(torch.float8_e4m3fn).float(), scale


def attention_reference(q, k, v, scale):
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    return torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, dim=-1), v)


def attention_bf16(q, k, v, scale):
    q, k, v = (t.to(torch.bfloat16).float() for t in (q, k, v))
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    p = torch.exp(s - s.amax(dim=-1, keepdim=True))
    rowsum = p.sum(dim=-1, keepdim=True)
    o = torch.einsum("bhqk,bkhd->bqhd", p.to(torch.bfloat16).float(), v)
    return (o / rowsum.permute(0, 2, 1, 3)).to(torch.bfloat16).double()


def attention_fp8(q, k, v, scale, block, transform=None, transform_v=False, p_shift=0, p_dtype=torch.float8_e4m3fn):
    """transform: M applied to Q and K; transform_v: also to V, with M^T applied to O (O M M^T = O).
    p_shift: P computed as 2^p_shift exp(s - max) (at most 2^p_shift; 8 keeps it below e4m3's 448 and
    its small entries out of the subnormal range), the row sums alike; p_dtype: P's type for PV."""
    if transform is not None:  # (Q M)(K M)^T = Q K^T for orthogonal M
        q, k = q @ transform, k @ transform
        if transform_v:
            v = v @ transform
    (q8, sq), (k8, sk), (v8, sv) = quantize(q, block), quantize(k, block), quantize(v, block)
    # S in fp32 from the e4m3 values, then descaled per (query row, key row): each factor is one
    # number per tile in the kernel (a block's scale), here broadcast over the elements.
    s = torch.einsum("bqhd,bkhd->bhqk", q8, k8)
    s = s * (sq.float().permute(0, 2, 1, 3) * sk.float().permute(0, 2, 3, 1)) * scale
    p = torch.exp(s - s.amax(dim=-1, keepdim=True)) * 2.0**p_shift
    rowsum = p.sum(dim=-1, keepdim=True)
    # O = sum over key blocks of (P8 V8) times the block's V scale: one number per key block, which
    # the kernel folds into the per-row rescale it already applies to O between key blocks.
    o = torch.einsum("bhqk,bkhd->bqhd", p.to(p_dtype).float(), v8 * sv.float())
    o = o / rowsum.permute(0, 2, 1, 3)
    if transform is not None and transform_v:
        o = o.double() @ transform.T
    return o.to(torch.bfloat16).double()


def rmse(a, b):
    return float((a - b).pow(2).mean().sqrt())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seqlen", type=int, default=1024)
    ap.add_argument("--dims", default="64,128,256")
    ap.add_argument("--block", type=int, default=128, help="rows per scale under block quantization")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--variants", action="store_true",
                    help="also P scaled by 2^8, scales per 64 rows, the transform on V too, P in bf16")
    ap.add_argument("--json")
    args = ap.parse_args()

    rows = []
    print(f"b = {args.batch}, h = {args.heads}, n = {args.seqlen}, block = {args.block} rows; RMSE against float64")
    print(f"{'d':>4} | {'bf16':>9} | {'fp8 tensor':>10} | {'fp8 block':>9} | {'block+hadamard':>14} | tensor / block+hadamard")
    for d in (int(x) for x in args.dims.split(",")):
        g = torch.Generator().manual_seed(args.seed + d)
        shape = (args.batch, args.seqlen, args.heads, d)
        q, k, v = (outlier_normal(shape, g, args.device) for _ in range(3))
        scale = 1.0 / math.sqrt(d)
        ref = attention_reference(q, k, v, scale)
        row = {
            "d": d,
            "bf16": rmse(attention_bf16(q, k, v, scale), ref),
            "fp8_per_tensor": rmse(attention_fp8(q, k, v, scale, 0), ref),
            "fp8_block": rmse(attention_fp8(q, k, v, scale, args.block), ref),
            "fp8_block_hadamard": rmse(attention_fp8(q, k, v, scale, args.block, hadamard(d, g, args.device)), ref),
        }
        row["per_tensor_over_block_hadamard"] = row["fp8_per_tensor"] / row["fp8_block_hadamard"]
        if args.variants:  # candidate ways to lower block + Hadamard's error further
            hd = hadamard(d, g, args.device)
            row["variants"] = {
                "per_tensor_p_shift8": rmse(attention_fp8(q, k, v, scale, 0, p_shift=8), ref),
                "block_hadamard_p_shift8": rmse(attention_fp8(q, k, v, scale, args.block, hd, p_shift=8), ref),
                "block64_hadamard_p_shift8": rmse(attention_fp8(q, k, v, scale, 64, hd, p_shift=8), ref),
                "block_hadamard_qkv_p_shift8": rmse(
                    attention_fp8(q, k, v, scale, args.block, hd, transform_v=True, p_shift=8), ref),
                "block_hadamard_p_bf16": rmse(attention_fp8(q, k, v, scale, args.block, hd, p_dtype=torch.bfloat16), ref),
            }
        rows.append(row)
        print(f"{d:>4} | {row['bf16']:9.2e} | {row['fp8_per_tensor']:10.2e} | {row['fp8_block']:9.2e} | "
              f"{row['fp8_block_hadamard']:14.2e} | {row['per_tensor_over_block_hadamard']:.2f}")
        for name, err in row.get("variants", {}).items():
            print(f"       {name:>28}: {err:9.2e}, per tensor / this {row['fp8_per_tensor'] / err:.2f}")
    if args.json:
        info = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "torch": torch.__version__,
                "device": args.device, "batch": args.batch, "heads": args.heads, "seqlen": args.seqlen,
                "block": args.block, "seed": args.seed,
                "method": "python/benchmarks/fp8_accuracy.py: FP8 attention emulated in PyTorch, RMSE against float64"}
        with open(args.json, "w") as f:
            json.dump({"info": info, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
