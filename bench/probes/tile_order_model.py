#!/usr/bin/env python3
"""How evenly a tile order spreads causal attention tiles over the CTAs: the model behind the tile
order's predictions (docs/log/sm90-forward.md and docs/log/sm80-forward.md, 2026-11-25).
No GPU needed.

The CTAs take tiles in index order, each the moment it is free (the sm90 kernel's persistent
claim; the sm80 grid's dispatch is close to it). A causal tile of query block m costs its key
blocks times a steady period plus a fixed boundary, scaled by uniform noise. Printed: the time
the last CTA finishes over an ideal split of the same work, for three layouts of the (batch, head)
pairs into sections:
  old      sections of the L2 share (or --old-pairs) pairs, the partial one last (the sm90 order
           before 9ab7e69; --old-pairs 1 gives the sm80 family's old 3D grid);
  current  the partial section first and a last section of at least 3 tiles per CTA, capped at
           the pairs whose K/V fit L2 (mirrors TileOrder::make in src/cuda/common/tile_order.cuh);
  global   one section (longest first over everything; ignores L2).
Within a section the longest query blocks come first, then the pairs.

Defaults are the sm90 kernel's on an H100 (132 CTAs, 128-row tiles, the traced periods of the
timeline in docs/log/sm90-forward.md, 2026-11-23);
for the sm80 family pass e.g. --ctas 264 --period 1 --boundary 2 --block-n 64 --old-pairs 1.

Usage: tile_order_model.py [--ctas N] [--period P] [--boundary B] [--block-n K] d:n [d:n ...]
  e.g. tile_order_model.py 128:2048 256:4096 --period 3000 --boundary 4000 --block-n 80
"""
import argparse
import heapq
import math
import random

L2_BYTES = 50 << 20  # H100


def layout(pairs, per_section, last, lead):
    """(first pair, pairs) of each section in order."""
    sections, first = [], 0
    if lead:
        sections.append((0, lead))
        first = lead
    while first < pairs - last:
        sections.append((first, per_section))
        first += per_section
    sections.append((pairs - last, last))
    return sections


def order(m_blocks, sections):
    return [m for _, count in sections for m in range(m_blocks - 1, -1, -1) for _ in range(count)]


def makespan(tiles, cost, ctas, seed):
    rng = random.Random(seed)
    free = [0.0] * ctas
    for m in tiles:
        heapq.heapreplace(free, free[0] + cost(m) * rng.uniform(0.85, 1.15))
    return max(free)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shapes", nargs="+", help="d:n, bf16, 16k tokens, hidden 2048")
    ap.add_argument("--ctas", type=int, default=132)
    ap.add_argument("--period", type=float, default=2765, help="cycles per key block")
    ap.add_argument("--boundary", type=float, default=3000, help="cycles per tile")
    ap.add_argument("--block-n", type=int, default=128, help="keys per block")
    ap.add_argument("--block-m", type=int, default=128, help="query rows per tile")
    ap.add_argument("--old-pairs", type=int, default=0, help="pairs per section of the old layout (0: the L2 share)")
    ap.add_argument("--seeds", type=int, default=5)
    args = ap.parse_args()
    for shape in args.shapes:
        d, n = (int(x) for x in shape.split(":"))
        pairs = (16384 // n) * (2048 // d)
        m_blocks = n // args.block_m
        kv_bytes = 4 * n * d  # K and V, bf16
        cost = lambda m: math.ceil((m + 1) * args.block_m / args.block_n) * args.period + args.boundary
        ideal = pairs * sum(cost(m) for m in range(m_blocks)) / args.ctas
        per_section = max(1, min(pairs, L2_BYTES // 2 // kv_bytes))
        balanced = min(-(-3 * args.ctas // m_blocks), L2_BYTES // kv_bytes)
        last = min(pairs, max(per_section, balanced))
        old = min(pairs, args.old_pairs) if args.old_pairs > 0 else per_section
        layouts = {
            "old": layout(pairs, old, pairs % old or old, 0),
            "current": layout(pairs, per_section, last, (pairs - last) % per_section),
            "global": [(0, pairs)],
        }
        row = [f"d={d} n={n}: {pairs} pairs, sections of {per_section}, last {last}"]
        for name, sections in layouts.items():
            tiles = order(m_blocks, sections)
            t = sum(makespan(tiles, cost, args.ctas, s) for s in range(args.seeds)) / args.seeds
            row.append(f"{name} {t / ideal:.3f}")
        print("  ".join(row))


if __name__ == "__main__":
    main()
