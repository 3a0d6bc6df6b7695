#pragma once
// Paged K/V in the sm90 forward's producer warp. A key block of kBlockN keys arrives as
// kBlockN / kPageRows TMA boxes of kPageRows (16) keys, each from the page that block_table names
// for them (common/kv_layout.hpp: kv_page): lane c of the warp looks up box c's page and issues its
// copy, so a block's lookups are one load per lane, in parallel. Boxes past the sequence's last
// key are read past the end of the pool, which TMA fills with zeros. The producer looks a block's
// pages up one load ahead (forward_producer.cuh), so that the lookup's latency passes while it
// waits for a free stage instead of between the stage's release and its copies.
//
// Where pages hold whole key blocks (page_size a multiple of kBlockN: pages of 128, 256 or 512 up
// to head dim 128), a block that lies within the sequence's keys arrives as one copy, as in the
// contiguous kernel: TMA has a cost per copy, and sixteen 2 KB boxes per 32 KB block made the
// forward about 1.35x slower than one copy (H100, 2026-11-28; docs/kernels/kv-cache.md).
//
// V's box holding the sequence's last key, where that key does not end a box, is copied by the
// warp with plain loads and stores instead: its rows past the last key are written as zeros.
// A cache's rows there may hold anything, NaN included (an engine's pool is often
// uninitialized), and P.V multiplies them by P's zeros. K's rows there need nothing: their scores
// are replaced by the mask. The copy waits for its loads, once per tile at most.
//
// Rows copied by cp.async instead of boxes (by this warp, or by the whole producer warpgroup) ran
// 1.3-2.1x slower at head dim 128 (H100, 2026-11-28; docs/kernels/kv-cache.md).
#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/pipeline/pipeline.hpp>

#include "common/kv_layout.hpp"
#include "cuda/sm90/forward_params.cuh"

namespace flashattn::cuda::sm90 {

// What PagedKeyBlocks::load needs of K or of V: the page-box copy, its coordinates over the pool
// (row in page, head dim, heads_kv, page) and the stages as it partitions them (TMA, 1, 1, box, 1,
// stage); the whole-block copy, its coordinates over the pool and the stages as it partitions
// them (TMA, TMA_M, TMA_N, stage); and the plain (key, head dim, stage) stages (V's tail box).
template <class BoxTma, class BoxPool, class Boxes, class BlockTma, class BlockPool, class BlockStages, class Stages>
struct PagedOperand {
  BoxTma const& box_tma;
  BoxPool box_pool;
  Boxes boxes;
  BlockTma const& block_tma;
  BlockPool block_pool;
  BlockStages block_stages;
  Stages& stages;
};
template <class BoxTma, class BoxPool, class Boxes, class BlockTma, class BlockPool, class BlockStages, class Stages>
CUTE_DEVICE auto make_paged_operand(BoxTma const& box_tma, BoxPool box_pool, Boxes boxes, BlockTma const& block_tma,
                                    BlockPool block_pool, BlockStages block_stages, Stages& stages) {
  return PagedOperand<BoxTma, BoxPool, Boxes, BlockTma, BlockPool, BlockStages, Stages>{
      box_tma, box_pool, boxes, block_tma, block_pool, block_stages, stages};
}

template <class Traits>
struct PagedKeyBlocks {
  static constexpr int kBlockN = Traits::kBlockN, kHeadDim = Traits::kHeadDim, kPageRows = Traits::kPageRows;
  static constexpr int kBoxes = kBlockN / kPageRows;
  static_assert(kBoxes <= 32, "one lane per box");
  using Element = typename Traits::Element;

  ForwardParams<Traits> const& p;
  int b;        // the sequence (its row of block_table)
  int head_kv;  // the KV head
  int len_k;    // the sequence's keys
  int lane;
  bool leader;  // the lane that arrives on the pipelines' barriers

  // The page holding keys [row, row + kPageRows) of the sequence, or one past the pool (TMA's
  // zero fill) for rows past its end.
  CUTE_DEVICE int page_of(int row) const {
    return row < len_k ? int(detail::kv_page(p.kv.pages, b, row)) : p.kv.pages.num_pages;
  }
  // This lane's box of key block `block`: its page (lanes past the block's boxes: none).
  CUTE_DEVICE int box_page(int block) const {
    return lane < kBoxes ? page_of(block * kBlockN + lane * kPageRows) : p.kv.pages.num_pages;
  }

  // Loads key block `block` of K (kValues false) or V into the pipeline's next stage; page: this
  // lane's box_page(block). x: the operand's copies and views (PagedOperand).
  template <bool kValues, class Pipeline, class State, class Storage, class Operand>
  CUTE_DEVICE void load(Pipeline& pipeline, State& state, Storage& storage, Operand& x, int block, int page) const {
    using namespace cute;
    const int row0 = block * kBlockN;
    if (p.kv.pages.page_size % kBlockN == 0 && row0 + kBlockN <= len_k) {  // one copy (lane 0's page)
      pipeline.producer_acquire(state);
      if (leader) {
        Tensor g = local_tile(x.block_pool(_, _, head_kv, page), Shape<Int<kBlockN>, Int<kHeadDim>>{},
                              make_coord(row0 % p.kv.pages.page_size / kBlockN, _0{}));
        copy(x.block_tma.with(*pipeline.producer_get_barrier(state), 0, TMA::CacheHintSm90::EVICT_LAST),
             x.block_tma.get_slice(_0{}).partition_S(g), x.block_stages(_, _, _, state.index()));
      }
      ++state;
      return;
    }
    // The box (of this block) that holds the last key without ending with it; -1: none.
    int tail_box = -1;
    if constexpr (kValues) {
      const int box = len_k / kPageRows - block * kBoxes;
      if (len_k % kPageRows != 0 && box >= 0 && box < kBoxes) tail_box = box;
    }
    if (tail_box >= 0) {
      storage.empty_barrier_[state.index()].wait(state.phase());
      copy_tail_box(x.stages, state.index(), row0 + tail_box * kPageRows, tail_box);
      cutlass::arch::fence_view_async_shared();  // the stores, before the wgmmas that read them
      __syncwarp();
      // Arrive (a release) after the stores; TMA brings the other boxes' bytes.
      if (leader) storage.full_barrier_[state.index()].arrive_and_expect_tx(Traits::kKeyBytes - Traits::kPageBoxBytes);
    } else {
      pipeline.producer_acquire(state);
    }
    if (lane < kBoxes && lane != tail_box) {
      const int row = row0 + lane * kPageRows;
      const int in_page = row < len_k ? row % p.kv.pages.page_size : 0;
      Tensor box = local_tile(x.box_pool(_, _, head_kv, page), typename Traits::PageBox{}, make_coord(in_page / kPageRows, _0{}));
      copy(x.box_tma.with(*pipeline.producer_get_barrier(state), 0, TMA::CacheHintSm90::EVICT_LAST),
           x.box_tma.get_slice(_0{}).partition_S(box), x.boxes(_, _, _, lane, _0{}, state.index()));
    }
    ++state;
  }

  // V rows [first, first + kPageRows) of the sequence into rows of box `box` of `stage`: the
  // sequence's rows copied, the rest (and columns past the problem's head dim) zero.
  template <class Stages>
  CUTE_DEVICE void copy_tail_box(Stages& stages, int stage, int first, int box) const {
    constexpr int kVectors = kHeadDim / 8;  // 16-byte vectors of a row
    const int valid = len_k - first;
    const int page = page_of(first), in_page = first % p.kv.pages.page_size;
    const Element* src = static_cast<const Element*>(p.v) + page * p.v_page_stride + in_page * p.v_row_stride +
                         head_kv * p.v_head_stride;
    for (int i = lane; i < kPageRows * kVectors; i += 32) {
      const int r = i / kVectors, c = i % kVectors * 8;
      uint4 value = make_uint4(0, 0, 0, 0);
      if (r < valid && c < p.head_dim) value = *reinterpret_cast<const uint4*>(src + r * p.v_row_stride + c);
      *reinterpret_cast<uint4*>(&stages(box * kPageRows + r, c, stage)) = value;
    }
  }
};

}  // namespace flashattn::cuda::sm90
