"""Decoding bandwidth against the split-KV count, in ONE process on one GPU: contiguous and paged
caches (pages of 16 and 256 tokens, a sequence's pages in a random order over the pool) through
flashattn.forward_kvcache (the kernels, without flash_attn_with_kvcache's bounds check), batch 8,
32 query heads over 8 KV heads, d = 128, bf16, one query, against SDPA's cuDNN backend on the
contiguous cache. num_splits = 0 is the library's heuristic. TB/s = K+V bytes / time (do_bench
medians of --rounds interleaved rounds); each output is checked against the contiguous result.

Usage: python decode_split_count.py [--splits 0,4,8,16,32] [--lens 16384,65536,131072] [--rounds 3]
"""
import argparse
import json
import statistics

import torch

import flashattn
from decode_paged import cudnn_timer, ms  # the same timing

B, HQ, HK, D = 8, 32, 8, 128


def paged_copy(x, page, order):
    """(b, n, h, d) -> a pool of pages, page i of the flattened sequences at pool row order[i]."""
    b, n, h, d = x.shape
    pool = torch.empty(b * (n // page), page, h, d, device=x.device, dtype=x.dtype)
    pool[order] = x.reshape(-1, page, h, d)
    return pool


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--splits", default="0,4,8,16,32")
    ap.add_argument("--lens", default="16384,65536,131072")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    splits_list = [int(s) for s in args.splits.split(",")]
    lens = [int(s) for s in args.lens.split(",")]
    rounds = args.rounds
    for nk in lens:
        q = torch.randn(B, 1, HQ, D, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(B, nk, HK, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        seqlens = torch.full((B,), nk, dtype=torch.int32, device="cuda")
        kv_bytes = 2 * k.numel() * k.element_size()
        out = torch.empty_like(q)
        caches = {"contig": (k, v, None)}
        for page in (16, 256):
            order = torch.randperm(B * (nk // page), device="cuda")
            caches[f"paged{page}"] = (paged_copy(k, page, order), paged_copy(v, page, order),
                                      order.reshape(B, -1).to(torch.int32))
        ref = torch.empty_like(q)
        flashattn.forward_kvcache(q, k, v, ref, cache_seqlens=seqlens)
        timers = {}
        for name, (kc, vc, table) in caches.items():
            for s in splits_list:
                flashattn.forward_kvcache(q, kc, vc, out, cache_seqlens=seqlens, block_table=table, num_splits=s)
                diff = (out.float() - ref.float()).abs().max().item()
                assert diff < 2e-2, (name, s, diff)
                timers[(name, s)] = (lambda kc=kc, vc=vc, table=table, s=s: ms(
                    lambda: flashattn.forward_kvcache(q, kc, vc, out, cache_seqlens=seqlens, block_table=table, num_splits=s)))
        timers[("cudnn", 0)] = cudnn_timer(q, k, v)
        samples = {key: [] for key in timers}
        for _ in range(rounds):
            for key, t in timers.items():
                samples[key].append(t())
        tbs = {key: kv_bytes / statistics.median(s) / 1e9 for key, s in samples.items()}
        c = tbs[("cudnn", 0)]
        print(f"KV {nk}: cudnn {c:.3f} TB/s")
        for name in caches:
            print("  %-9s " % name + "  ".join(f"s={s}: {tbs[(name, s)]:.3f} ({tbs[(name, s)] / c:.3f})" for s in splits_list))
        print(json.dumps({"n_k": nk, "tbs": {f"{n}_{s}": x for (n, s), x in tbs.items()}}), flush=True)
        del q, k, v, caches, timers, out, ref
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
