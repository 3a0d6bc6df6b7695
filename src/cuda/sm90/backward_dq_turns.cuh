#pragma once
// Deterministic mode of the sm90 backward: the CTAs add their shares of a dQ block in key-block
// order, last to first (why that order: backward_producer.cuh). A counter per (query head, dQ
// block) counts the key blocks that have added theirs; the key block that `expected` blocks of
// the block's adders follow waits until the counter reaches it, adds, and increments it. The
// producer warpgroup takes and passes the turns (backward_producer.cuh): up to head dim 128 its
// warp 1 does both and adds too (bulk reduce-adds from shared memory); at 192 and 256 the
// consumer warpgroups add their halves of the columns from registers
// (backward_consumer_split.cuh), warp 2 takes the turn and warp 1 passes it.
#include <cute/config.hpp>

#include "cuda/sm90/backward_tile.cuh"

namespace flashattn::cuda::sm90 {

// The counter of dQ block `block` of query head `head`.
template <class Traits>
CUTE_DEVICE int* dq_turn_counter(BackwardParams<Traits> const& p, int head, std::int64_t block) {
  return p.dq_semaphore + std::int64_t(head) * p.dq_layout.blocks_per_head + block;
}

// How many key blocks add to query block `m_block` after this tile's (the counter value at which
// this tile adds).
template <class Traits>
CUTE_DEVICE int dq_turn_expected(BackwardParams<Traits> const& p, BackwardTile const& t, int m_block) {
  const KeyTileRange adders =
      query_block_mask(t, p.window_left, p.window_right, m_block, Traits::kBlockM).tiles(Traits::kBlockN);
  return adders.end - 1 - t.n_block;
}

// Waits until `*counter == expected` (acquire at GPU scope). A wrong expectation would hang the
// GPU; a bounded wait turns that into a launch error instead.
CUTE_DEVICE void wait_for_turn(int const* counter, int expected) {
  int value, spins = 0;
  for (;;) {
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(value) : "l"(counter) : "memory");
    if (value == expected) break;
    if (++spins > (1 << 26)) __trap();
    __nanosleep(64);
  }
}

}  // namespace flashattn::cuda::sm90
