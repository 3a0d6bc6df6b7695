#pragma once
// The order in which the sm90 backward's persistent CTAs claim tiles (a block of keys of one
// column: KV head, chunk of its query heads, sequence). Plain C++, so host tests check it.
//
// Default: key blocks fastest, first to last, then columns. The CTAs of one head run close
// together and share its Q and dO through L2; under a causal mask a head's longest tiles (its
// first key blocks) come first.
//
// Deterministic mode: key blocks last to first, the order in which they add to dQ
// (backward_producer.cuh), so every tile that must add before another was claimed before it and
// the CTAs never wait for a tile nobody runs. And the tiles of `interleave` columns take turns
// (column c's key block n, column c + 1's, ..., then column c's key block n - 1): a tile adds to
// a dQ block only after the next key block's tile has, an add's latency at least, so a column's
// tiles claimed back to back (all at once when CTAs free up together) trail each other by that
// latency at every step, and its first key block's tile finishes (key blocks - 1) latencies late.
// Claimed `interleave` claims apart, a tile starts that much later instead, while its CTA still
// works on its previous tile.
#include <algorithm>

#include "common/host_device.hpp"

namespace flashattn::cuda::sm90 {

struct BackwardTilePosition {
  int n_block;
  int column;  // over every sequence's columns: (KV head, chunk) fastest
};

struct BackwardClaimOrder {
  int n_blocks;    // key blocks per column
  int columns;     // columns of every sequence
  int interleave;  // 0: the default order; else deterministic mode's, columns taking turns

  FA_HOST_DEVICE BackwardTilePosition at(int index) const {
    if (interleave == 0) return {index % n_blocks, index / n_blocks};
    const int group_tiles = interleave * n_blocks;
    const int group = index / group_tiles, within = index % group_tiles;
    const int rest = columns - group * interleave;
    const int group_columns = rest < interleave ? rest : interleave;
    return {n_blocks - 1 - within / group_columns, group * interleave + within % group_columns};
  }

  // Deterministic mode's interleave: a column's consecutive tiles are claimed about interleave *
  // (a tile's steps) / ctas steps apart, and an add's latency is about a step at d = 64 (the
  // shortest step): so ctas / steps columns, at most 16 (their Q and dO share L2).
  static int deterministic_interleave(int ctas, int steps_per_tile) {
    steps_per_tile = std::max(steps_per_tile, 1);
    return std::clamp((ctas + steps_per_tile - 1) / steps_per_tile, 1, 16);
  }
};

}  // namespace flashattn::cuda::sm90
