#pragma once
// The order in which the sm90 backward's persistent CTAs claim tiles (a block of keys of one
// column: KV head, chunk of its query heads, sequence). Plain C++, so host tests check it.
//
// Default: each column's key blocks first to last, the longest first under a causal mask (key
// block 0 is seen by every query row). The tiles of a column run close together and share its Q,
// dO and dQ through L2: they walk the same query blocks a few steps apart. With few tiles (a
// handful of waves: GQA, whose columns are whole groups of query heads, or a short batch) and a
// mask, one column at a time leaves the last columns' longest tiles for the last wave; then every
// column takes turns (column c's key block 0, column c + 1's, ..., then column c's key block 1),
// longest first over all. With many tiles that costs more in L2 than it saves: measured on an
// H100 (2026-11-28, docs/kernels/sm90-backward.md, "Claim order and GQA splits").
//
// Deterministic mode: key blocks last to first, the order in which they add to dQ
// (backward_producer.cuh), so every tile that must add before another was claimed before it and
// the CTAs never wait for a tile nobody runs. And without a mask the tiles of `interleave`
// columns take turns as above. Without a mask a column's tiles walk the same query blocks in
// step, and a tile adds to a dQ block only after the next key block's tile has, an add's latency
// later: the k tiles of a column that run at once chain k - 1 latencies (at d = 64 about as long
// as a step). Equally long tiles start in waves of as many as there are CTAs, so interleaving
// columns is what makes k small.
#include <algorithm>

#include "common/host_device.hpp"

namespace flashattn::cuda::sm90 {

struct BackwardTilePosition {
  int n_block;
  int column;  // over every sequence's columns: (KV head, chunk) fastest
};

struct BackwardClaimOrder {
  int n_blocks;        // key blocks per column
  int columns;         // columns of every sequence
  int interleave;      // columns taking turns (at least 1)
  bool last_to_first;  // deterministic mode: key blocks last to first

  FA_HOST_DEVICE BackwardTilePosition at(int index) const {
    const int turns = interleave > 0 ? interleave : 1;
    const int group_tiles = turns * n_blocks;
    const int group = index / group_tiles, within = index % group_tiles;
    const int rest = columns - group * turns;
    const int group_columns = rest < turns ? rest : turns;
    const int rank = within / group_columns;
    return {last_to_first ? n_blocks - 1 - rank : rank, group * turns + within % group_columns};
  }

  // The default mode's interleave: all columns under a mask when the tiles fill at most
  // kMaskedInterleaveWaves waves of CTAs, else one column at a time.
  static constexpr int kMaskedInterleaveWaves = 4;
  static int default_interleave(bool masked, int columns, long long tiles, int ctas) {
    return masked && tiles <= (long long)kMaskedInterleaveWaves * ctas ? std::max(columns, 1) : 1;
  }

  // Deterministic mode's interleave without a mask: at most 1 + steps / 8 tiles of a column in
  // a wave of `ctas` (the chained latencies an eighth of a tile or less), as far as the columns'
  // Q, dO and fp32 dQ (column_bytes each) fit in half the L2.
  static int deterministic_interleave(int ctas, int steps_per_tile, long long column_bytes, long long l2_bytes) {
    const int together = 1 + std::max(steps_per_tile, 0) / 8;
    const long long fit = column_bytes > 0 ? l2_bytes / 2 / column_bytes : ctas;
    return int(std::max(1LL, std::min<long long>((ctas + together - 1) / together, fit)));
  }
};

// GQA without a mask: into how many chunks the query heads of a KV head are split, each chunk a
// column of tiles (fp32 dK/dV partials and a summing pass when more than one). Every tile is as
// long, so the kernel lasts whole waves of them: the fewest splits whose waves hold no more steps
// than more splits' would. (GQA 16/4, d = 128, n = 2k, b = 4: 1 split, 256 tiles, where the sm80
// family's rule of about two tiles per CTA, which masked problems keep, splits in two and ran 7%
// longer.)
inline int unmasked_head_splits(int group_size, long long tiles_per_split, int ctas) {
  const int slots = std::max(ctas, 1);
  int best = group_size;
  long long best_steps = -1;
  for (int splits = 1; splits <= group_size; ++splits) {
    if (group_size % splits != 0) continue;
    const long long waves = (tiles_per_split * splits + slots - 1) / slots;
    const long long steps = waves * (group_size / splits);  // per query block of a head's walk
    if (best_steps < 0 || steps < best_steps) best = splits, best_steps = steps;
  }
  return best;
}

}  // namespace flashattn::cuda::sm90
