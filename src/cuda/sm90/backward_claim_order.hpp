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
// the CTAs never wait for a tile nobody runs. And without a mask the tiles of `interleave`
// columns take turns (column c's key block n, column c + 1's, ..., then column c's key block
// n - 1). Without a mask a column's tiles walk the same query blocks in step, and a tile adds to
// a dQ block only after the next key block's tile has, an add's latency later: the k tiles of a
// column that run at once chain k - 1 latencies (at d = 64 about as long as a step). Equally long
// tiles start in waves of as many as there are CTAs, so interleaving columns is what makes k
// small.
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

  // Deterministic mode's interleave without a mask: at most 1 + steps / 8 tiles of a column in
  // a wave of `ctas` (the chained latencies an eighth of a tile or less), as far as the columns'
  // Q, dO and fp32 dQ (column_bytes each) fit in half the L2.
  static int deterministic_interleave(int ctas, int steps_per_tile, long long column_bytes, long long l2_bytes) {
    const int together = 1 + std::max(steps_per_tile, 0) / 8;
    const long long fit = column_bytes > 0 ? l2_bytes / 2 / column_bytes : ctas;
    return int(std::max(1LL, std::min<long long>((ctas + together - 1) / together, fit)));
  }
};

}  // namespace flashattn::cuda::sm90
