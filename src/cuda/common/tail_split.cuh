#pragma once
// Which key blocks of a persistent launch's last partial wave go to which work item: plain C++
// (host tests use it). How the split tiles' segments are merged: sm90/forward_tail_split.cuh.
//
// A launch without a mask has T tiles of equal length, so its last T mod CTAs tiles run as a
// partly filled last wave while the other CTAs idle (an H100 spent 2-3% of its cycles so at
// 16k tokens: docs/log/sm90-forward.md, tail split). Those tiles' key blocks are dealt out
// instead as `units` work items of nearly equal length, at most one per CTA: a unit is a run of
// consecutive key blocks of one tile or of two adjacent tiles (a unit is shorter than a tile), so
// each of those tiles is split into segments.
#include "common/host_device.hpp"

namespace flashattn::cuda {

struct TailSplit {
  int first_tile = 0;  // tiles [first_tile, tiles) are dealt out as units; all tiles: none
  int blocks = 0;      // key blocks per tile
  int units = 0;       // work items that replace those tiles (0: none)
  int tail_blocks = 0; // (tiles - first_tile) * blocks

  FA_HOST_DEVICE bool active() const { return units > 0; }
  // Tiles dealt out (0 when inactive).
  FA_HOST_DEVICE int tiles() const { return units > 0 ? tail_blocks / blocks : 0; }
  // Work items of the launch: the tiles before the tail, then the units.
  FA_HOST_DEVICE int num_items() const { return first_tile + units; }
  // First key block of unit u, counted over the tail's tiles in order (unit `units`: the end).
  FA_HOST_DEVICE int unit_begin(int u) const { return int((long long)u * tail_blocks / units); }
  // The unit holding block b of the tail: the last u with unit_begin(u) <= b.
  FA_HOST_DEVICE int unit_of(int b) const { return int(((long long)(b + 1) * units - 1) / tail_blocks); }
  // Segments of unit u: 1, or 2 where it runs across a tile boundary (a unit is shorter than a tile).
  FA_HOST_DEVICE int segments(int u) const {
    return (unit_begin(u + 1) - 1) / blocks - unit_begin(u) / blocks + 1;
  }
  // Workspace slot of segment s (0 or 1) of unit u.
  FA_HOST_DEVICE static int slot(int u, int s) { return 2 * u + s; }
  FA_HOST_DEVICE int num_slots() const { return 2 * units; }
  // The tail's tile (0-based within the tail) of segment s of unit u, and its key blocks.
  FA_HOST_DEVICE int segment_tile(int u, int s) const { return unit_begin(u) / blocks + s; }
  FA_HOST_DEVICE void segment_blocks(int u, int s, int& begin, int& end) const {
    const int t = segment_tile(u, s), first = t * blocks;
    const int b0 = unit_begin(u), b1 = unit_begin(u + 1);
    begin = (b0 > first ? b0 : first) - first;
    end = (b1 < first + blocks ? b1 : first + blocks) - first;
  }
  // The units whose segments make up tail tile t: [unit_of(first block), unit_of(last block)].
  FA_HOST_DEVICE int first_unit(int t) const { return unit_of(t * blocks); }
  FA_HOST_DEVICE int last_unit(int t) const { return unit_of(t * blocks + blocks - 1); }
  // The slot of unit u's segment in tail tile t (its second one if the unit began in tile t - 1).
  FA_HOST_DEVICE int slot_in_tile(int u, int t) const { return slot(u, unit_begin(u) < t * blocks ? 1 : 0); }

  // tiles: the launch's tiles; ctas: its persistent grid; blocks: key blocks of every tile;
  // eligible: every tile the same length (no mask, fixed length) and a kernel that can merge.
  // Deals out the last partial wave when that shortens it by at least 8 key blocks and a
  // quarter of a tile: each segment pays a tile's start and end and its partial's write and
  // merge. On an H100 at d = 128 (docs/log/sm90-forward.md, tail split) the split lost 2-3%
  // where it saved 3 blocks a unit (n = 1k) and 0.4% where it saved 7 (2k), and gained 1.3-2.9%
  // from 15 (4k-16k).
  static TailSplit make(long long tiles, int ctas, int blocks, bool eligible) {
    TailSplit s;
    s.first_tile = int(tiles);
    if (!eligible || blocks < 2 || ctas <= 0 || tiles <= ctas) return s;
    const int rest = int(tiles % ctas);
    if (rest == 0) return s;
    const long long tail_blocks = (long long)rest * blocks;
    const long long longest = (tail_blocks + ctas - 1) / ctas;  // key blocks of the longest unit
    const long long saved = blocks - longest;
    if (saved < 8 || 4 * saved < blocks || tail_blocks > 0x3fffffffLL) return s;
    s.first_tile = int(tiles) - rest;
    s.blocks = blocks;
    s.units = int(tail_blocks < ctas ? tail_blocks : ctas);
    s.tail_blocks = int(tail_blocks);
    return s;
  }
};

}  // namespace flashattn::cuda
