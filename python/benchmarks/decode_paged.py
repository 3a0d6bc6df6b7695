"""Serving benchmark: decoding over a KV cache through flash_attn_with_kvcache, in ONE process on
one GPU, every figure as K+V read bandwidth (TB/s) and as a ratio to our contiguous decoding.

Shapes (issue "Serving"): batch 8, 32 query heads over 8 KV heads, d = 128, bf16 (or --dtype f16),
KV 4k-128k. Per KV length, interleaved in --rounds rounds (medians):
  contiguous      flash_attn_with_kvcache on a contiguous cache, 1 query (our decoding)
  func            flash_attn_func(q, k, v) on the same contiguous cache (the plain decode path)
  cudnn           SDPA's cuDNN backend on the contiguous cache in its (b, h, n, d) layout
  paged16/256     flash_attn_with_kvcache on a paged cache, pages of 16 and 256 tokens,
                  pages of a sequence scattered over the pool (a random permutation). With
                  cache_seqlens a CUDA tensor the call includes flash-attn's bounds check
                  (every sequence fits its block_table row): one device-to-host read, a
                  synchronization, which exposes the host's time for the rest of the call
  paged16/256_unchecked  the same attention through the library's entry point
                  (flashattn.forward_kvcache, no bounds check): the kernels alone, as a CUDA
                  graph replays them (the check is skipped while capturing)
  append_rotary   contiguous + k/v of 1 new token appended and rotated (rotary_dim 128, causal),
                  the cost of append + rotary in the same call
  spec4           4 queries per sequence (speculative decoding), causal, contiguous
Targets: paged >= 0.97x contiguous and >= 1.0x cudnn from KV 16k (paged*_unchecked: the kernels';
paged*: the call with its check); append_rotary <= 5% over
contiguous (bandwidth ratio >= 0.95); spec4 >= 0.9x the bandwidth of one query.
The bytes counted are those of the K/V the queries see (b * n_k * h_kv * d * 2 * 2 bytes).

Usage: python decode_paged.py [--lens 4096,16384,65536,131072] [--dtype bf16|f16] [--rounds 3]
                              [--json PATH]
"""
import argparse
import datetime
import json
import math
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import flashattn
from flashattn.torch import flash_attn_func, flash_attn_with_kvcache

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}
B, HQ, HK, D = 8, 32, 8, 128


def ms(fn):
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def cudnn_timer(q, k, v):
    """A timer (ms per call) of SDPA's cuDNN backend on contiguous (b, n, h, d) q, k, v."""
    qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))

    def time():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return ms(lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True))
    return time


def paged_copy(k, page):
    """(b, n, h, d) -> (pages scattered over a pool, block table)."""
    b, n, h, d = k.shape
    per_seq = n // page
    order = torch.randperm(b * per_seq, device=k.device)
    pool = torch.empty(b * per_seq, page, h, d, device=k.device, dtype=k.dtype)
    pool[order] = k.reshape(b * per_seq, page, h, d)
    return pool, order.reshape(b, per_seq).to(torch.int32)


def rows(lens, rounds, dtype):
    for nk in lens:
        row = {"n_k": nk, "b": B, "h": HQ, "h_kv": HK, "d": D, "rounds": rounds}
        q = torch.randn(B, 1, HQ, D, device="cuda", dtype=dtype)
        q4 = torch.randn(B, 4, HQ, D, device="cuda", dtype=dtype)
        k, v = (torch.randn(B, nk, HK, D, device="cuda", dtype=dtype) for _ in range(2))
        seqlens = torch.full((B,), nk, dtype=torch.int32, device="cuda")
        before = seqlens - 1  # the appended token is the cache's last row
        k1, v1 = (torch.randn(B, 1, HK, D, device="cuda", dtype=dtype) for _ in range(2))
        angle = torch.rand(nk, D // 2, device="cuda") * 2 * math.pi
        cos, sin = angle.cos().to(dtype), angle.sin().to(dtype)
        kv_bytes = 2 * k.numel() * k.element_size()
        timers = {
            "contiguous": lambda: ms(lambda: flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens)),
            "func": lambda: ms(lambda: flash_attn_func(q, k, v)),
            "append_rotary": lambda: ms(lambda: flash_attn_with_kvcache(
                q, k, v, k1, v1, rotary_cos=cos, rotary_sin=sin, cache_seqlens=before, causal=True)),
            "spec4": lambda: ms(lambda: flash_attn_with_kvcache(q4, k, v, cache_seqlens=seqlens, causal=True)),
        }
        caches = {}
        out_unchecked = torch.empty_like(q)
        for page in (16, 256):
            kp, table = paged_copy(k, page)
            vp, _ = paged_copy(v, page)
            vp[table.long().flatten()] = v.reshape(-1, page, HK, D)
            caches[page] = (kp, vp, table)
            timers[f"paged{page}"] = (lambda kp=kp, vp=vp, table=table: ms(
                lambda: flash_attn_with_kvcache(q, kp, vp, cache_seqlens=seqlens, block_table=table)))
            timers[f"paged{page}_unchecked"] = (lambda kp=kp, vp=vp, table=table: ms(
                lambda: flashattn.forward_kvcache(q, kp, vp, out_unchecked, cache_seqlens=seqlens, block_table=table)))
        timers["cudnn"] = cudnn_timer(q, k, v)
        # Correctness first: paged equals contiguous (same kernel, same order of keys).
        ref = flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens)
        for page, (kp, vp, table) in caches.items():
            got = flash_attn_with_kvcache(q, kp, vp, cache_seqlens=seqlens, block_table=table)
            row[f"paged{page}_max_diff"] = (got.float() - ref.float()).abs().max().item()
            flashattn.forward_kvcache(q, kp, vp, out_unchecked, cache_seqlens=seqlens, block_table=table)
            row[f"paged{page}_unchecked_max_diff"] = (out_unchecked.float() - ref.float()).abs().max().item()
        samples = {name: [] for name in timers}
        for _ in range(rounds):
            for name, t in timers.items():
                samples[name].append(t())
        for name, s in samples.items():
            t = statistics.median(s)
            row[name + "_ms"] = t
            row[name] = kv_bytes / t / 1e9  # TB/s
        for name in timers:
            row[name + "_vs_contiguous"] = row[name] / row["contiguous"]
        for name in ("paged16", "paged256", "paged16_unchecked", "paged256_unchecked"):
            row[name + "_vs_cudnn"] = row[name] / row["cudnn"]
        del q, q4, k, v, caches, timers
        torch.cuda.empty_cache()
        print(json.dumps(row), flush=True)
        yield row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lens", default="4096,16384,65536,131072")
    ap.add_argument("--dtype", default="bf16", choices=DTYPES)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    info = {"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
            "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(), "dtype": args.dtype}
    result = list(rows([int(x) for x in args.lens.split(",") if x], args.rounds, DTYPES[args.dtype]))
    print(f"\n{info['device']}, {args.dtype}, b={B}, {HQ}/{HK} heads, d={D}: TB/s (ratio to contiguous)")
    names = ["contiguous", "func", "cudnn", "paged16", "paged256", "paged16_unchecked", "paged256_unchecked",
             "append_rotary", "spec4"]
    print(f"{'KV':>7} | " + " | ".join(f"{n:>18}" for n in names))
    for r in result:
        print(f"{r['n_k']:>7} | " + " | ".join(f"{r[n]:9.2f} ({r[n + '_vs_contiguous']:.3f})" for n in names))
    print("\nvs cudnn:")
    for r in result:
        print(f"{r['n_k']:>7} | " + " | ".join(
            f"{n} {r[n + '_vs_cudnn']:.3f}" for n in ("paged16", "paged256", "paged16_unchecked", "paged256_unchecked")))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"info": info, "decode_paged": result}, f, indent=1)


if __name__ == "__main__":
    main()
