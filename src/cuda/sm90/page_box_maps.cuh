#pragma once
// One TMA box per page of a paged K/V pool (the sm90 paged forward, forward_paged_kv.cuh), at head
// dims whose rows span two or more 128-byte swizzle atoms (Traits::kPageBoxes: 128, 192, 256).
//
// A page's kPageRows (16) keys of one KV head are 16 rows x head dim, a pool row apart. The paged
// kernel's K and V stages order their swizzle atoms (8 keys x 64 columns) along the head dim first
// (forward_traits.cuh), so those 16 keys are one run of shared memory, which one box of
// (64 columns, 8 rows, head dim / 64 atom columns, 2 row groups, 1) fills: a 5-D tensor map over
// the pool. A key block held whole by a page (page_size a multiple of kBlockN) is one box of
// kBlockN / 8 row groups. TMA maps have at most 5 dimensions, so the KV head shares one, which
// flash-attn's (pages, page_size, heads_kv, d) pools and heads-major ones allow
// (page_box_coords.hpp). Other pools keep CuTe's copies of the same stages, which split a page into
// 1 KB boxes of 8 rows x 64 columns.
// Measured on one SM (bench/probes/tma_box_rate.cu, H200, 2026-11-28), 16 keys x 128 columns a
// page: two 2 KB boxes (the order along the keys) 13.6 bytes a cycle, one 4 KB box 18.4, four
// 1 KB boxes 9.8; the 4 KB boxes beside cp.async rows of other pages from 96 threads (the value
// loader) 22.1 with five pages of eight by boxes.
#include <cstdint>

#include <cuda.h>
#include <cute/arch/copy_sm90_desc.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cutlass/cuda_host_adapter.hpp>

#include "common/problem.hpp"
#include "cuda/sm90/page_box_coords.hpp"

namespace flashattn::cuda::sm90 {

struct PageBoxMaps {
  cute::TmaDescriptor k_page, v_page;    // a box: one page's kPageRows keys
  cute::TmaDescriptor k_block, v_block;  // a box: one key block (built where pages hold whole blocks)
  PageBoxCoords coords;  // coords.usable false: the pools take CuTe's copies
  bool blocks = false;   // k_block and v_block built
};

// Issues the box of `map` at `page` (past the pool: zeros) for KV head `head`, from row
// `row_in_page` (a multiple of 8) of the page, into `smem` (the run's first byte).
CUTE_DEVICE void load_page_box(cute::TmaDescriptor const& map, PageBoxMaps const& maps, uint64_t& barrier, void* smem,
                               int head, int page, int row_in_page) {
  const PageBoxCoords& c = maps.coords;
  cute::SM90_TMA_LOAD_5D::copy(&map, &barrier, static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_LAST), smem, 0, 0,
                               head * c.column_per_head, row_in_page / 8, page * c.outer_per_page + head * c.outer_per_head);
}

namespace page_box_detail {

template <class Element>
bool encode(cute::TmaDescriptor& map, const void* pool, const std::uint64_t (&dims)[5],
            const std::uint64_t (&strides_bytes)[4], const std::uint32_t (&box)[5]) {
  const std::uint32_t element_strides[5] = {1, 1, 1, 1, 1};
  const CUresult r = CUTLASS_CUDA_DRIVER_WRAPPER_CALL(cuTensorMapEncodeTiled)(
      &map, cute::TMA::to_CUtensorMapDataType<Element>(), 5, const_cast<void*>(pool), dims, strides_bytes, box,
      element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS;
}

}  // namespace page_box_detail

// The maps of problem p's K and V pools, or coords.usable false where their strides allow no such
// box (page_box_coords.hpp) or the driver declines one.
template <class Traits>
PageBoxMaps make_page_box_maps(const detail::ForwardProblem& p) {
  using Element = typename Traits::Element;
  constexpr int kHeadDim = Traits::kHeadDim, kPageRows = Traits::kPageRows, kBlockN = Traits::kBlockN;
  constexpr int kAtomCols = 128 / int(sizeof(Element)), kAtomColumns = kHeadDim / kAtomCols;
  PageBoxMaps m;
  if constexpr (!Traits::kPageBoxes) return m;
  static_assert(!Traits::kPageBoxes || (kHeadDim % kAtomCols == 0 && kPageRows % 8 == 0 && kBlockN % 8 == 0));
  const PageBoxCoords c = page_box_coords(p, kHeadDim, kAtomCols);
  if (!c.usable) return m;
  const bool in_row = c.outer_per_head == 0;
  const std::uint64_t heads = p.heads_kv, pages = p.kv.pages.num_pages, page_rows = p.kv.pages.page_size;
  const std::int64_t bytes = sizeof(Element);
  auto build = [&](cute::TmaDescriptor& map, const detail::SeqTensor& t, int rows) {
    const std::uint64_t dims[5] = {kAtomCols, 8, in_row ? heads * kAtomColumns : kAtomColumns, page_rows / 8,
                                   in_row ? pages : pages * heads};
    const std::uint64_t strides[4] = {std::uint64_t(t.seq_stride * bytes), std::uint64_t(kAtomCols * bytes),
                                      std::uint64_t(8 * t.seq_stride * bytes),
                                      std::uint64_t((in_row ? t.batch_stride : t.head_stride) * bytes)};
    const std::uint32_t box[5] = {kAtomCols, 8, kAtomColumns, std::uint32_t(rows / 8), 1};
    return page_box_detail::encode<Element>(map, t.data, dims, strides, box);
  };
  if (!build(m.k_page, p.k, kPageRows) || !build(m.v_page, p.v, kPageRows)) return m;
  m.coords = c;
  m.blocks = page_rows % kBlockN == 0 && build(m.k_block, p.k, kBlockN) && build(m.v_block, p.v, kBlockN);
  return m;
}

}  // namespace flashattn::cuda::sm90
