#pragma once
// Paged K/V in the sm90 forward's producer warpgroup.
//
// At head dims 128, 192 and 256 (Traits::kPageBoxes) the paged kernel's K and V stages hold a
// page's 16 keys x head dim as one run of shared memory (forward_traits.cuh), which one 5-D TMA box
// fills (page_box_maps.cuh); pools whose strides allow no such box take CuTe's copies of the same
// runs, in 1 KB boxes. At other head dims CuTe's boxes are the only ones.
//
// K: a key block of kBlockN keys arrives as kBlockN / kPageRows boxes of kPageRows (16) keys,
// each from the page that block_table names for them (common/kv_layout.hpp: kv_page): lane c of
// the producer warp looks up box c's page and issues its copy, so a block's lookups are one load
// per lane, in parallel. Boxes past the sequence's last key are read past the end of the pool,
// which TMA fills with zeros (their scores are replaced by the mask). The producer looks a
// block's pages up one load ahead (forward_producer.cuh), so that the lookup's latency passes
// while it waits for a free stage instead of between the stage's release and its copies.
//
// V: the producer warpgroup's other three warps (run_value_loader): the first value_box_pages
// pages of a block within the sequence's keys as boxes, the others as 16-byte cp.async pieces of
// their rows, zero-filled past the sequence's last key and past the problem's head dim. One SM
// takes in pages faster by both paths at once than by either (bench/probes/tma_box_rate.cu;
// docs/kernels/kv-cache.md). Rows past the sequence must be zeros in V: a cache's rows there may
// hold anything, NaN included (an engine's pool is often uninitialized), and P.V multiplies them
// by P's zeros; so a block that reaches past them takes no boxes.
//
// Where pages hold whole key blocks (page_size a multiple of kBlockN: pages of 128, 256 or 512
// up to head dim 128), a block that lies within the sequence's keys arrives as one TMA copy, K
// and V alike.
#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/pipeline/pipeline.hpp>

#include "common/kv_layout.hpp"
#include "cuda/common/device_math.cuh"
#include "cuda/sm90/forward_params.cuh"
#include "cuda/sm90/forward_tile.cuh"
#include "cuda/sm90/page_box_maps.cuh"

namespace flashattn::cuda::sm90 {

// What PagedKeyBlocks::load_keys needs of K: its stages, (key, head dim, stage); CuTe's page-box
// copy, its coordinates over the pool (row in page, head dim, heads_kv, page) and the stages as
// it partitions them (TMA, 1, 1, box, 1, stage); CuTe's whole-block copy, its coordinates over
// the pool and the stages as it partitions them (TMA, TMA_M, TMA_N, stage).
template <class Stages, class BoxTma, class BoxPool, class Boxes, class BlockTma, class BlockPool, class BlockStages>
struct PagedOperand {
  Stages stages;
  BoxTma const& box_tma;
  BoxPool box_pool;
  Boxes boxes;
  BlockTma const& block_tma;
  BlockPool block_pool;
  BlockStages block_stages;
};
template <class Stages, class BoxTma, class BoxPool, class Boxes, class BlockTma, class BlockPool, class BlockStages>
CUTE_DEVICE auto make_paged_operand(Stages stages, BoxTma const& box_tma, BoxPool box_pool, Boxes boxes,
                                    BlockTma const& block_tma, BlockPool block_pool, BlockStages block_stages) {
  return PagedOperand<Stages, BoxTma, BoxPool, Boxes, BlockTma, BlockPool, BlockStages>{
      stages, box_tma, box_pool, boxes, block_tma, block_pool, block_stages};
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

  // Loads key block `block` of K into the pipeline's next stage; page: this lane's
  // box_page(block). x: K's copies and views (PagedOperand).
  template <class Pipeline, class State, class Operand>
  CUTE_DEVICE void load_keys(Pipeline& pipeline, State& state, Operand& x, int block, int page) const {
    using namespace cute;
    const int row0 = block * kBlockN, stage = state.index();
    pipeline.producer_acquire(state);
    uint64_t& barrier = *pipeline.producer_get_barrier(state);
    if (whole_block(row0)) {  // one copy (lane 0's page)
      if (leader)
        copy_whole_block(p.page_maps.k_block, &x.stages(0, 0, stage), x.block_tma, x.block_pool,
                         x.block_stages(_, _, _, stage), barrier, page, row0);
    } else if (lane < kBoxes) {
      const int row = row0 + lane * kPageRows;
      const int in_page = row < len_k ? row % p.kv.pages.page_size : 0;
      if (Traits::kPageBoxes && p.page_maps.coords.usable) {
        load_page_box(p.page_maps.k_page, p.page_maps, barrier, &x.stages(lane * kPageRows, 0, stage), head_kv, page,
                      in_page);
      } else {
        Tensor box = local_tile(x.box_pool(_, _, head_kv, page), typename Traits::PageBox{},
                                make_coord(in_page / kPageRows, _0{}));
        copy(x.box_tma.with(barrier, 0, TMA::CacheHintSm90::EVICT_LAST), x.box_tma.get_slice(_0{}).partition_S(box),
             x.boxes(_, _, _, lane, _0{}, stage));
      }
    }
    ++state;
  }

  // Whether the key block starting at row0 arrives as one copy: its page holds it whole and it
  // lies within the sequence's keys.
  CUTE_DEVICE bool whole_block(int row0) const {
    return p.kv.pages.page_size % kBlockN == 0 && row0 + kBlockN <= len_k;
  }

  // The block starting at row0, held whole by `page` (whole_block(row0)), into a stage as one TMA
  // copy: K's by the producer warp, V's by the value loader. The 5-D box of `block_map` into the
  // stage's first byte `run` where the pools allow it (page_box_maps.cuh), else CuTe's copy into
  // `stage` as it partitions it.
  template <class Tma, class Pool, class Stage>
  CUTE_DEVICE void copy_whole_block(cute::TmaDescriptor const& block_map, void* run, Tma const& tma, Pool const& pool,
                                    Stage&& stage, uint64_t& barrier, int page, int row0) const {
    using namespace cute;
    if (Traits::kPageBoxes && p.page_maps.blocks) {
      load_page_box(block_map, p.page_maps, barrier, run, head_kv, page, row0 % p.kv.pages.page_size);
      return;
    }
    Tensor g = local_tile(pool(_, _, head_kv, page), Shape<Int<kBlockN>, Int<kHeadDim>>{},
                          make_coord(row0 % p.kv.pages.page_size / kBlockN, _0{}));
    copy(tma.with(barrier, 0, TMA::CacheHintSm90::EVICT_LAST), tma.get_slice(_0{}).partition_S(g), stage);
  }
};

// V's key blocks, loaded by the producer warpgroup's warps 1-3 (Traits::kValueWarpThreads
// threads; `thread` counts from 0 among them) in the order the producer warp loads K's (each
// tile's blocks last to first): the same work items, read from the tile slots as the consumers
// read them. A stage's full barrier counts one arrival per loader thread: a thread's cp.async
// pieces arrive when they land (the .noinc arrive), and for a whole-block TMA copy thread 0
// arrives with the copy's bytes and the others at once.
template <class Traits>
CUTE_DEVICE void run_value_loader(ForwardParams<Traits> const& p, typename Traits::SharedStorage& smem,
                                  typename Traits::PipelineV& pipeline_v, typename Traits::PipelineTile& pipeline_tile,
                                  int thread) {
  using namespace cute;
  constexpr int kBlockN = Traits::kBlockN, kHeadDim = Traits::kHeadDim;
  constexpr int kPieces = kHeadDim / 8;  // 16-byte pieces of a row
  static_assert(Traits::kValueWarpThreads % kPieces == 0, "groups of whole rows");
  constexpr int kGroups = Traits::kValueWarpThreads / kPieces;  // threads of a box: a piece of each row
  constexpr int kPageRows = Traits::kPageRows, kBoxes = kBlockN / kPageRows;
  using Element = typename Traits::Element;
  Tensor sV = make_tensor(make_smem_ptr(smem.v.data()), typename Traits::SmemLayoutV{});  // (key, head dim, stage)
  Tensor mV = p.tma_v.get_tma_tensor(p.shape_v);  // the pool: (row in page, head dim, heads_kv, page)
  Tensor tVsV = p.tma_v.get_slice(_0{}).partition_D(sV);  // (TMA, TMA_M, TMA_N, stage)
  const int piece = thread % kPieces, group = thread / kPieces;
  const bool piece_in_head = piece * 8 < p.head_dim;
  const int page_size = p.kv.pages.page_size;

  auto state_v = cutlass::make_producer_start_state<typename Traits::PipelineV>();
  for_each_published_item(pipeline_tile, smem, p.tail.num_items(), [&](TileWork const& w) {
    const int b = w.coord.batch, head_kv = w.coord.head / p.group, len_k = w.seq.len_k;
    const PagedKeyBlocks<Traits> pages{p, b, head_kv, len_k, 0, false};
    const Element* head_rows = static_cast<const Element*>(p.v) + head_kv * p.v_head_stride + piece * 8;
    for (int block = w.key_blocks.end - 1; block >= w.key_blocks.begin; --block) {
      pipeline_v.producer_acquire(state_v);  // no thread leads: only the wait for a free stage
      const int row0 = block * kBlockN, stage = state_v.index();
      auto& full = smem.pipeline_v.full_barrier_[stage];
      uint64_t& barrier = *pipeline_v.producer_get_barrier(state_v);  // `full`, as TMA takes it
      if (pages.whole_block(row0)) {
        if (thread == 0) {
          full.arrive_and_expect_tx(Traits::kKeyBytes);
          pages.copy_whole_block(p.page_maps.v_block, &sV(0, 0, stage), p.tma_v, mV, tVsV(_, _, _, stage), barrier,
                                 pages.page_of(row0), row0);
        } else {
          full.arrive();
        }
      } else {
        // The block's first `boxed` pages by boxes, a thread each (its bytes expected before the
        // thread's arrival below), where the block lies within the sequence's keys.
        const int boxed = Traits::kPageBoxes && p.page_maps.coords.usable && row0 + kBlockN <= len_k ? p.value_box_pages : 0;
        if (thread < boxed) {
          const int row = row0 + thread * kPageRows;
          full.expect_transaction(Traits::kPageBytes);
          load_page_box(p.page_maps.v_page, p.page_maps, barrier, &sV(thread * kPageRows, 0, stage), head_kv,
                        pages.page_of(row), row % page_size);
        }
        // A group of kPieces threads copies a 16-key box: one page lookup, then its rows at a fixed
        // stride, a piece a thread. Measured against this at head dims 64 / 128 (H100, 2026-11-28):
        // a lookup per row (a division and a dependent load each) made the forward 2.2-3.0x slower;
        // 8-row units, which share a block's rows more evenly at 128, 5-16% slower; the lookups
        // made before the wait for a free stage, 7% faster at 64 but 1-4% slower with pages of 256
        // at 128 (docs/kernels/kv-cache.md).
        for (int box = boxed + group; box < kBoxes; box += kGroups) {
          const int row = row0 + box * kPageRows;
          const int rows = piece_in_head ? max(0, min(kPageRows, len_k - row)) : 0;  // the rest: zeros
          const Element* src = head_rows;  // not read where past `rows`
          if (rows > 0) src += int64_t(pages.page_of(row)) * p.v_page_stride + int64_t(row % page_size) * p.v_row_stride;
          Tensor box_rows = local_tile(sV(_, _, stage), Shape<Int<kPageRows>, Int<8>>{}, make_coord(box, piece));
          CUTE_UNROLL
          for (int r = 0; r < kPageRows; ++r) cp_async_16(&box_rows(r, 0), src + r * p.v_row_stride, r < rows);
        }
        cutlass::arch::cpasync_barrier_arrive_noinc(reinterpret_cast<uint64_t const*>(&full));
      }
      ++state_v;
    }
  });
}

}  // namespace flashattn::cuda::sm90
