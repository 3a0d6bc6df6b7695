"""Paged decoding against how the pool's pages lie, in ONE process on one GPU: each sequence's
pages taken from the pool in stretches of R consecutive pages, the stretches in a random order (R = 1 is
an allocator that scatters every page; in order: a sequence's pages one after another). Batch 8, 32 query heads
over 8 KV heads, d = 128, bf16, one query, through flashattn.forward_kvcache (the kernels, without
flash_attn_with_kvcache's bounds check), against our contiguous cache and SDPA's cuDNN backend on
it. TB/s = K+V bytes / time (do_bench medians of --rounds interleaved rounds); every output is
checked against the contiguous result.

Usage: python decode_page_stretches.py [--lens 16384,65536,131072] [--rounds 3] [--json out.json]
"""
import argparse
import json
import statistics

import torch

import flashattn
from decode_paged import cudnn_timer, ms  # the same timing
from decode_split_count import paged_copy  # the same pool copy

B, HQ, HK, D = 8, 32, 8, 128
STRETCHES = {16: [1, 2, 4, 8, 16, 0], 256: [1, 0]}  # pages per stretch; 0: every sequence's pages in order


def pool_order(pages, stretch):
    """Pool position of each logical page (sequences one after another): stretches of `stretch`
    consecutive pool pages in a random order; stretch 0 keeps the order."""
    if stretch == 0:
        return torch.arange(pages, device="cuda")
    order = torch.randperm(pages // stretch, device="cuda")
    i = torch.arange(pages, device="cuda")
    return order[i // stretch] * stretch + i % stretch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lens", default="16384,65536,131072")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    results = []
    for nk in [int(s) for s in args.lens.split(",")]:
        q = torch.randn(B, 1, HQ, D, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(B, nk, HK, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        seqlens = torch.full((B,), nk, dtype=torch.int32, device="cuda")
        kv_bytes = 2 * k.numel() * k.element_size()
        out, ref = torch.empty_like(q), torch.empty_like(q)
        flashattn.forward_kvcache(q, k, v, ref, cache_seqlens=seqlens)
        caches = {"contiguous": (k, v, None)}
        for page, stretches in STRETCHES.items():
            for stretch in stretches:
                order = pool_order(B * (nk // page), stretch)
                caches[f"page{page}_" + (f"stretch{stretch}" if stretch else "in_order")] = (paged_copy(k, page, order), paged_copy(v, page, order),
                                                          order.reshape(B, -1).to(torch.int32))
        timers = {}
        for name, (kc, vc, table) in caches.items():
            flashattn.forward_kvcache(q, kc, vc, out, cache_seqlens=seqlens, block_table=table)
            diff = (out.float() - ref.float()).abs().max().item()
            assert diff < 2e-2, (name, diff)
            timers[name] = (lambda kc=kc, vc=vc, table=table: ms(
                lambda: flashattn.forward_kvcache(q, kc, vc, out, cache_seqlens=seqlens, block_table=table)))
        timers["cudnn"] = cudnn_timer(q, k, v)
        samples = {name: [] for name in timers}
        for _ in range(args.rounds):
            for name, t in timers.items():
                samples[name].append(t())
        tbs = {name: kv_bytes / statistics.median(s) / 1e9 for name, s in samples.items()}
        row = {"n_k": nk, "tb_s": tbs,
               "vs_contiguous": {n: tbs[n] / tbs["contiguous"] for n in caches},
               "vs_cudnn": {n: tbs[n] / tbs["cudnn"] for n in caches}}
        results.append(row)
        print(f"KV {nk}: contiguous {tbs['contiguous']:.3f} TB/s, cudnn {tbs['cudnn']:.3f}")
        for n in caches:
            print(f"  {n:16s} {tbs[n]:.3f} TB/s  {row['vs_contiguous'][n]:.3f}x contiguous  "
                  f"{row['vs_cudnn'][n]:.3f}x cudnn")
    if args.json:
        info = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "dtype": "bf16",
                "batch": B, "heads_q": HQ, "heads_kv": HK, "head_dim": D, "rounds": args.rounds}
        json.dump({"info": info, "page_stretches": results}, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
