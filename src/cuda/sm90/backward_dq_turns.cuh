#pragma once
// Deterministic mode of the sm90 backward: the CTAs add their shares of a dQ block in key-block
// order, last to first (why that order: backward_producer.cuh). A counter per (query head, dQ
// block [, column slice]) counts the key blocks that have added theirs; the key block that
// `expected` blocks of the block's adders follow waits until the counter reaches it, adds, and
// increments it. Who adds: the dQ writer warp (bulk reduce-adds from shared memory) up to head dim
// 128, each consumer warpgroup for its half of the columns (reductions from registers) at 192
// and 256 (backward_consumer_split.cuh).
#include <cute/config.hpp>
#include <cutlass/arch/barrier.h>

#include "cuda/sm90/backward_tile.cuh"

namespace flashattn::cuda::sm90 {

// The counter of dQ block `block` of query head `head` (slice: the column slice, where the
// slices are added by different warpgroups, each in its own order).
template <class Traits>
CUTE_DEVICE int* dq_turn_counter(BackwardParams<Traits> const& p, int head, std::int64_t block, int slice) {
  return p.dq_semaphore + (std::int64_t(head) * p.dq_layout.blocks_per_head + block) * Traits::kDqTurnSlices + slice;
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

// A consumer warpgroup's turns (128 threads, named barrier `barrier`), around its reductions
// (red.global.add, the generic proxy). A step's turn passes at the warpgroup's next turn or at the
// end of its tile, not right after its reductions: the release waits until they are performed,
// which at the L2's reduction rate took long enough to stall every step (measured, H200,
// 2026-11-27: 0.63-0.74x the default mode when the turn passed at once). The turn held is not
// kept in registers (they are short here: 100 bytes more spilled); the caller names it again.
struct WarpgroupDqTurns {
  int thread;
  uint32_t barrier;

  // Passes `held` (the previous step's turn, or null: its reductions, issued a step ago, are
  // performed by now), then waits for `counter` to reach `expected`. The barriers order every
  // thread's earlier reductions before the release and its coming ones after the acquire.
  CUTE_DEVICE void take(int* counter, int expected, int* held) const {
    pass(held);
    if (thread == 0) wait_for_turn(counter, expected);
    cutlass::arch::NamedBarrier::sync(128, barrier);
  }
  // Passes `held` on (release at GPU scope: a fence, then the increment).
  CUTE_DEVICE void pass(int* held) const {
    if (held == nullptr) return;
    cutlass::arch::NamedBarrier::sync(128, barrier);
    if (thread == 0) asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(held) : "memory");
  }
};

}  // namespace flashattn::cuda::sm90
