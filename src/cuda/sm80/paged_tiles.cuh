#pragma once
// Paged K/V in the sm80 forward: the pages of a key tile, fetched one tile ahead.
//
// A paged key row lives in page block_table[b][row / page_size], at row row % page_size of it
// (common/kv_layout.hpp). The loaders used to read that entry per row, right before the row's
// cp.async: a global load whose result the copy's address needs, so each of a thread's 8 rows of
// a 128-row tile waited for it in turn (SASS: one branch per row, the load consumed inside it),
// twice per tile (K and V), whatever the page size (docs/log/sm80-forward.md, 2026-11-26: paged
// decoding).
//
// Here the CTA copies the block_table entries a key tile spans (at most kBlockN / 16 + 1: pages
// are multiples of 16 rows, a tile may start inside one) into shared memory with 4-byte cp.async,
// one tile ahead; the first tile's are fetched before Q is loaded and waited for before the loop.
// A loader finds a row's page by a multiply-shift division by the page size (FastDivmod, set on
// the host) and a shared-memory read; no global load stands before any cp.async of K or V.
// Two slot sets, by tile parity (the loop runs over tiles last to first):
//  - the decode tiles locate a tile's rows before the wait that precedes its copies (the kernel
//    keeps one tile in flight; what stands between a barrier and the next copies delays them).
//    Tile t - 1's entries go out with K(t)'s copies (in the iteration of tile t + 1), into the set
//    that held tile t + 1's, whose last reader (V(t + 1)'s rows) came before the barrier that
//    follows the wait for V(t + 1). They land with K(t), are visible after the barrier that
//    follows its wait, and are read by K(t - 1)'s rows before the wait for V(t) and by V(t - 1)'s
//    before the wait for K(t - 1);
//  - the prefill tiles locate rows after the barrier. Tile t - 1's entries go out with V(t)'s
//    copies (iteration t), into the set whose last reader, V(t + 1)'s issue, came before the
//    barrier that opens iteration t; they are read by K(t - 1) after the barrier that follows the
//    wait for V(t), and by V(t - 1) in the next iteration.
// Nothing here is held in registers across the tile loop (a tile's rows only across the wait
// before its copies): the page size and the block table come from the kernel parameters
// (constant memory), the slots from a fixed shared-memory offset.
#include <cstdint>

#include <cute/arch/copy_sm80.hpp>

#include "cuda/sm80/forward_params.hpp"

namespace flashattn::cuda::sm80 {

// The block_table columns of a key tile: pages [page0, page0 + pages) of the sequence.
struct TilePageSpan {
  int page0, pages;
};

template <int kBlockN>
struct TilePages {
  static_assert(kBlockN % 16 == 0);
  // Pages a tile of kBlockN rows can span, rounded up to whole 16-byte loads (load_set).
  static constexpr int kSlots = (kBlockN / 16 + 1 + 3) / 4 * 4;
  // Dynamic shared memory the kernel needs beyond its tiles when K/V are paged (launched with it
  // only then, so contiguous launches keep their residency).
  static constexpr int kSmemBytes = 2 * kSlots * int(sizeof(std::int32_t));

  // n / page_size for 0 <= n < 2^31 (page sizes are >= 16, so FastDivmod's divisor-1 case never
  // applies).
  static __device__ int page_of(const ForwardParams& p, int n) {
    return int(__umulhi(unsigned(n), p.page_div.multiplier) >> p.page_div.shift_right);
  }

  // Tile `tile` holds storage rows [first_row + tile * kBlockN, ...) of the sequence, up to its
  // end (first_row: SequenceSpan::offset_k; len_k: the sequence's keys).
  static __device__ TilePageSpan span(const ForwardParams& p, int first_row, int len_k, int tile) {
    const int page0 = page_of(p, first_row + tile * kBlockN);
    return {page0, page_of(p, first_row + min(len_k, (tile + 1) * kBlockN) - 1) - page0 + 1};
  }

  // Issues the copies of the tile's block_table entries (threads 0.. of the CTA, one each) into
  // the tile's slot set; they complete with the caller's next cp.async group.
  static __device__ void fetch(const ForwardParams& p, std::int32_t* slots, int batch, TilePageSpan span, int tile,
                               int tid) {
    if (tid < span.pages) {
      const std::int32_t* entry = p.kv.pages.block_table + batch * p.kv.pages.table_stride + span.page0 + tid;
      cute::SM80_CP_ASYNC_CACHEALWAYS<std::uint32_t>::copy(*reinterpret_cast<const std::uint32_t*>(entry),
                                                           reinterpret_cast<std::uint32_t*>(slots)[(tile & 1) * kSlots + tid]);
    }
  }

  // Entry i of the tile's pages (fetched, waited for and made visible by a barrier).
  static __device__ const std::int32_t* entries(const std::int32_t* slots, int tile) {
    return slots + (tile & 1) * kSlots;
  }

  // A whole slot set in registers, read with 16-byte loads issued together (slots past the tile's
  // pages hold stale entries: select only those of its pages).
  struct Set {
    std::uint32_t entry[kSlots];
  };
  static __device__ Set load_set(const std::int32_t* entries) {
    Set set;
    CUTE_UNROLL
    for (int i = 0; i < kSlots / 4; ++i) {
      const uint4 v = reinterpret_cast<const uint4*>(entries)[i];
      set.entry[4 * i] = v.x;
      set.entry[4 * i + 1] = v.y;
      set.entry[4 * i + 2] = v.z;
      set.entry[4 * i + 3] = v.w;
    }
    return set;
  }
};

// Waits for the cp.async groups this thread has committed, not for copies issued since the last
// commit (cp_async_wait<0> waits for those too).
CUTE_DEVICE void cp_async_wait_committed() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

}  // namespace flashattn::cuda::sm80
