#pragma once
// The sm80 forward kernel (FlashAttention-2 class). One CTA computes one block of kBlockM query
// rows against a range of key tiles: all the tiles its rows see, or one split of them. Rows are
// those of one (batch, query head), or, with GQA packing, of all query heads of one KV head.
//
// Per key tile, walking from the last tile to the first:
//   S = Q K^T (mma.sync, operands by ldmatrix from swizzled shared memory)
//   logits (softcap), ALiBi (when given), mask (only on tiles that cut a row's window or the
//   sequence end)
//   online softmax (rescale O once per tile), [dropout on P (kDropout)], O += P V
// K and V tiles are double-buffered against each other with cp.async: V(j) loads during
// Q K(j)^T, K(j-1) during softmax and P V(j). Each warp owns 16-row slices of the tile, so the
// softmax needs no shared-memory exchange. O is normalized once at the end and written through
// shared memory with 16-byte stores (or, for a split, as fp32 partials for the combine kernel).
// kColumns: how tile columns move (common/head_columns.cuh): `full` where the head dim is
// kHeadDim with 16-byte aligned rows; otherwise columns past the head dim are zero-filled on
// load and not stored, by 16-byte pieces (`vectors`) or element by element (`elements`).
#include <climits>

#include <cute/tensor.hpp>

#include "cuda/common/alibi.cuh"
#include "cuda/common/device_math.cuh"
#include "cuda/common/dropout.cuh"
#include "cuda/common/fragment.cuh"
#include "cuda/common/mask.cuh"
#include "cuda/common/online_softmax.cuh"
#include "cuda/common/programmatic_launch.cuh"
#include "cuda/common/warp_gemm.cuh"
#include "cuda/sm80/forward_params.hpp"
#include "cuda/sm80/fused_append.cuh"
#include "cuda/sm80/paged_tiles.cuh"

namespace flashattn::cuda::sm80 {

// The work of one CTA: which rows, which heads, which key tiles.
struct ForwardBlock {
  int batch, split;
  int head_block;  // the query head, or the KV head when query heads are packed into rows
  SequenceSpan seq;
  int row0;  // first (packed) row of the tile within the sequence
  int rows;  // valid rows in the tile
  BlockMask mask;
  KeyTileRange tiles;

  // Query row and query head of packed row `row` (counted from the sequence start).
  __device__ int query_row(const ForwardParams& p, int row) const {
    return p.pack == 1 ? row : row / p.pack;
  }
  __device__ int query_head(const ForwardParams& p, int row) const {
    return p.pack == 1 ? head_block : head_block * p.pack + row % p.pack;
  }
  __device__ int kv_head(const ForwardParams& p) const {
    if (p.pack != 1) return head_block;
    return p.group == 1 ? head_block : head_block / p.group;
  }
};

// Decodes the grid position; false if the CTA's query block lies past its sequence.
__device__ inline bool locate_block(const ForwardParams& p, int block_m, int block_n, ForwardBlock& b) {
  int m_block;
  if (p.order.num_tiles() > 0) {
    const TileCoord t = p.order.tile(int(blockIdx.x));
    m_block = t.m_block;
    b.head_block = t.head;
    b.batch = t.batch;
    b.split = 0;
  } else {
    m_block = blockIdx.x;
    b.head_block = blockIdx.y;
    // Integer divisions only where they divide: each is ~25 dependent instructions at the CTA's
    // start, before its first load (docs/log/sm80-forward.md, 2026-11-25: the per-CTA cost).
    b.batch = p.num_splits == 1 ? blockIdx.z : blockIdx.z / p.num_splits;
    b.split = p.num_splits == 1 ? 0 : blockIdx.z % p.num_splits;
  }
  b.seq = sequence_span(p, b.batch);
  const int packed_rows = b.seq.len_q * p.pack;
  b.row0 = m_block * block_m;
  if (b.row0 >= packed_rows) return false;
  b.rows = min(block_m, packed_rows - b.row0);
  b.mask = {b.seq.len_q, b.seq.len_k, p.window_left, p.window_right, b.query_row(p, b.row0),
            b.query_row(p, b.row0 + b.rows - 1)};
  b.tiles = b.mask.tiles(block_n);
  if (p.num_splits > 1) {  // this split's share of the block's own tiles
    const int per_split = (b.tiles.end - b.tiles.begin + p.num_splits - 1) / p.num_splits;
    const int begin = b.tiles.begin + b.split * per_split;
    b.tiles = {begin, min(b.tiles.end, begin + per_split)};
  }
  return true;
}

// kDropout: P is dropped (common/dropout.cuh) after the softmax, for P V only; the row sums and
// the LSE are those of the undropped scores, and O is scaled by 1 / (1 - p) at the end.
// Requires params.pack == 1. A template flag, so that kernels without dropout carry none of it.
// kFusedAppend: the kernel does params.fused_append first (sm80/fused_append.cuh); the decode
// tiles only.
template <class Traits, ColumnMode kColumns = ColumnMode::full, bool kDropout = false, bool kFusedAppend = false>
__global__ void __launch_bounds__(Traits::kThreads)
    forward_kernel(const __grid_constant__ ForwardParams params) {
  using namespace cute;
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  const int tid = threadIdx.x;
  // Launched programmatically (common/programmatic_launch.cuh): nothing in global memory before
  // the previous grid completes; the split-KV combine may be scheduled from here on.
  wait_for_previous_grid();
  allow_next_grid();

  ForwardBlock blk;
  if (!locate_block(params, kBlockM, kBlockN, blk)) return;

  // ---- global memory: rows are addressed one by one (packed rows gather across heads) ------
  const Element* q_base = static_cast<const Element*>(params.q);
  Element* out_base = static_cast<Element*>(params.out);
  const int kv_head = blk.kv_head(params);
  // K/V: the sequence's first row (contiguous), or its head within a page (paged: rows are
  // placed through the tile's pages, sm80/paged_tiles.cuh, in load_kv_tile).
  // Nothing paging needs is held in registers across the loop: the page size and the block
  // table's address come from the parameters, the pages from shared memory (ptxas -v: holding the
  // table's address cost the prefill tile 8 more bytes of spill stores).
  const Element* k_seq = static_cast<const Element*>(params.k) +
                         (params.kv.paged()
                              ? std::int64_t(kv_head) * params.k_layout.head_stride
                              : element_index(params.k_layout, blk.seq.kv_batch, blk.seq.offset_k, 0, kv_head));
  const Element* v_seq = static_cast<const Element*>(params.v) +
                         (params.kv.paged()
                              ? std::int64_t(kv_head) * params.v_layout.head_stride
                              : element_index(params.v_layout, blk.seq.kv_batch, blk.seq.offset_k, 0, kv_head));
  // Element index of row r of the tile in Q or O with query heads packed into rows.
  auto packed_row_index = [&](const detail::SeqTensor& layout, int r) {  // r: row within the tile
    const int row = blk.row0 + r;
    return element_index(layout, blk.batch, blk.seq.offset_q, blk.query_row(params, row),
                         blk.query_head(params, row));
  };

  // ---- shared memory: Q (later O), K, V ---------------------------------------------------
  extern __shared__ __align__(128) unsigned char smem_bytes[];
  Element* smem = reinterpret_cast<Element*>(smem_bytes);
  Tensor sQ = make_tensor(make_smem_ptr(smem), typename Traits::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(smem + Traits::kSmemQElems), typename Traits::SmemLayoutKV{});
  Tensor sV = make_tensor(make_smem_ptr(smem + Traits::kSmemQElems + Traits::kSmemKVElems),
                          typename Traits::SmemLayoutKV{});
  Tensor sVt = make_tensor(sV.data(), typename Traits::SmemLayoutVt{});
  Tensor sVtPlain = make_tensor(sV.data(), get_nonswizzle_portion(typename Traits::SmemLayoutVt{}));
  // Paged: the block_table entries of two key tiles, past the tiles (launched with it only then).
  using Pages = TilePages<kBlockN>;
  static_assert(Traits::kSmemBytes % 16 == 0);  // the page slots are read with 16-byte loads
  std::int32_t* page_slots = reinterpret_cast<std::int32_t*>(smem_bytes + Traits::kSmemBytes);

  // Each thread's 16-byte pieces of a tile, and their (row, column) in the tile.
  typename Traits::GmemTiledCopy gmem_copy;
  auto gmem_thr = gmem_copy.get_thread_slice(tid);
  Tensor tQsQ = gmem_thr.partition_D(sQ);
  Tensor tQc = gmem_thr.partition_D(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  Tensor tKsK = gmem_thr.partition_D(sK);
  Tensor tVsV = gmem_thr.partition_D(sV);
  Tensor tKVc = gmem_thr.partition_D(make_identity_tensor(Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  // Calls f(m, element index) for each of the thread's rows m of Q or O (tile row tQc(0, m, 0)).
  // Unpacked, the tile's rows are consecutive rows of one head and a thread's rows a fixed step
  // apart: the first row's index is computed once, the others by a multiply-add. Packed rows
  // gather across heads and are located one by one (~35 instructions a row; done for every
  // launch, that cost 1-4% at n = 1k: docs/log/sm80-forward.md, 2026-11-25: the per-CTA cost).
  constexpr int kRowStep = Traits::kThreads / Traits::kThreadsPerRow;  // rows between a thread's rows
  static_assert(decltype(size<1>(tQc))::value * kRowStep == kBlockM);
  const int thread_row0 = get<0>(tQc(0, 0, 0));
  auto for_each_thread_row = [&](const detail::SeqTensor& layout, auto&& f) {
    if (params.pack == 1) {
      const std::int64_t first =
          element_index(layout, blk.batch, blk.seq.offset_q, blk.row0 + thread_row0, blk.head_block);
      CUTE_UNROLL
      for (int m = 0; m < size<1>(tQc); ++m) f(m, first + std::int64_t(m * kRowStep) * layout.seq_stride);
    } else {
      CUTE_UNROLL
      for (int m = 0; m < size<1>(tQc); ++m) {
        const int r = get<0>(tQc(0, m, 0));
        f(m, r < blk.rows ? packed_row_index(layout, r) : 0);  // decoding: most rows are past blk.rows
      }
    }
  };
  // Writes the thread's 16-byte pieces of the block's output rows that exist (r < blk.rows);
  // piece(m, k) gives the value of the piece at tQc(0, m, k).
  auto store_out_rows = [&](auto piece) {
    for_each_thread_row(params.out_layout, [&](int m, std::int64_t index) {
      if (get<0>(tQc(0, m, 0)) >= blk.rows) return;
      Element* row_ptr = out_base + index;
      CUTE_UNROLL
      for (int k = 0; k < size<2>(tQc); ++k) {
        const int col = get<1>(tQc(0, m, k));
        store_piece<kColumns>(row_ptr + col, piece(m, k), col, params.cols);
      }
    });
  };

  // ---- the thread's accumulator coordinates -------------------------------------------------
  typename Traits::TiledMma tiled_mma;
  auto thr_mma = tiled_mma.get_thread_slice(tid);
  Tensor score_coords =
      rowcol_view(thr_mma.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{})));
  Tensor out_coords =
      rowcol_view(thr_mma.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{})));
  constexpr int kRows = decltype(size<0>(score_coords))::value;

  // A KV-cache call's new rows into the cache before any K/V load of this CTA (and before its
  // early return: the last split writes every row), and the rotated queries into shared memory.
  const bool queries_rotated = kFusedAppend && params.fused_append.rotates();
  if constexpr (kFusedAppend) {
    append_new_rows<Element>(params, blk.batch, blk.seq.kv_batch, kv_head, blk.split == params.num_splits - 1,
                             blk.seq.offset_k, blk.tiles.begin * kBlockN, blk.tiles.end * kBlockN, tid,
                             Traits::kThreads);
    if (queries_rotated) {
      load_rotated_queries<Element, kHeadDim>(
          params, blk.batch, blk.rows, sQ,
          [&](int r) {
            return QueryRowSource{packed_row_index(params.q_layout, r), blk.query_row(params, blk.row0 + r)};
          },
          tid, Traits::kThreads);
      CUTE_UNROLL
      for (int m = 0; m < size<1>(tQc); ++m) {  // rows past the block's: zero, as the copies' fill
        if (get<0>(tQc(0, m, 0)) < blk.rows) continue;
        CUTE_UNROLL
        for (int k = 0; k < size<2>(tQc); ++k) *reinterpret_cast<uint4*>(&tQsQ(0, m, k)) = make_uint4(0, 0, 0, 0);
      }
    }
    __syncthreads();
  }

  if (blk.tiles.empty()) {
    // No key visible to any row of the block (or to this split): output 0, LSE -inf.
    if (params.num_splits > 1) {
      for (int i = tid; i < blk.rows * kHeadDim; i += Traits::kThreads) {
        const int row = blk.row0 + i / kHeadDim;
        params.partial_out[partial_row(params, blk.split, blk.batch, blk.query_head(params, row),
                                       blk.query_row(params, row)) * kHeadDim + i % kHeadDim] = 0.f;
      }
      for (int r = tid; r < blk.rows; r += Traits::kThreads) {
        const int row = blk.row0 + r;
        params.partial_lse[partial_row(params, blk.split, blk.batch, blk.query_head(params, row),
                                       blk.query_row(params, row))] = -INFINITY;
      }
      return;
    }
    store_out_rows([](int, int) { return make_uint4(0, 0, 0, 0); });
    if (params.lse != nullptr)
      for (int r = tid; r < blk.rows; r += Traits::kThreads) {
        const int row = blk.row0 + r;
        params.lse[lse_index(params.lse_layout, blk.batch, blk.seq.offset_q,
                             blk.query_row(params, row), blk.query_head(params, row))] = -INFINITY;
      }
    return;
  }

  // ---- loads: Q once; K/V tiles with rows past the sequence zero-filled ----------------------
  // Paged: the first tile's pages, ahead of Q (waited for before the first K tile is issued).
  const int first_row = int(blk.seq.offset_k);  // paged: the sequence's storage row of key 0
  if (params.kv.paged()) {
    Pages::fetch(params, page_slots, blk.batch, Pages::span(params, first_row, blk.seq.len_k, blk.tiles.end - 1),
                 blk.tiles.end - 1, tid);
    cp_async_commit();
  }
  if (!queries_rotated) {
    for_each_thread_row(params.q_layout, [&](int m, std::int64_t index) {
      const bool valid = get<0>(tQc(0, m, 0)) < blk.rows;
      const Element* row_ptr = q_base + (valid ? index : 0);
      CUTE_UNROLL
      for (int k = 0; k < size<2>(tQc); ++k) {
        const int col = get<1>(tQc(0, m, k));
        load_piece<kColumns>(&tQsQ(0, m, k), row_ptr + col, valid, col, params.cols);
      }
    });
  }
  const int kv_row0 = get<0>(tKVc(0, 0, 0)), kv_col0 = get<1>(tKVc(0, 0, 0));
  // Issues the thread's pieces of a K/V tile; row_pointer(m, row, valid) gives the address of the
  // thread's m-th row (row = m * kRowStep rows after its first, valid: within the sequence).
  auto load_rows = [&](auto& smem_part, int first_key, auto&& row_pointer) {
    CUTE_UNROLL
    for (int m = 0; m < size<1>(tKVc); ++m) {
      const int row = get<0>(tKVc(0, m, 0)) - kv_row0;  // compile-time
      const bool valid = first_key + row < blk.seq.len_k;
      const Element* row_ptr = row_pointer(m, row, valid);
      CUTE_UNROLL
      for (int k = 0; k < size<2>(tKVc); ++k) {
        // Through load_piece: a head dim below the width (or rows that are not 16-byte aligned)
        // must not take whole 16-byte copies.
        const int dcol = get<1>(tKVc(0, m, k)) - kv_col0;  // compile-time
        load_piece<kColumns>(&smem_part(0, m, k), row_ptr + dcol, valid, kv_col0 + dcol, params.cols);
      }
    }
  };
  // Where the O accumulator leaves room (<= 64 floats a thread: the decode tiles up to d = 128,
  // the prefill tiles up to 64), paged rows take the fast paths of locate_paged_rows: a tile within
  // one page runs as contiguous rows, pages of a thread's row step skip the division, and the page
  // entries are read before any is used. Elsewhere (the prefill tiles from d = 128, which spill
  // already) they are found one by one, which keeps the registers those paths would take.
  constexpr bool kPagedFastPaths = kBlockM * kHeadDim / Traits::kThreads <= 64;
  // Rows located ahead (the decode tiles, bandwidth-bound): the addresses of a thread's rows of a
  // K/V tile, paged or not, are found before the wait that precedes the tile's copies (locate_rows),
  // so that after the barrier only the copies remain: the kernel keeps one tile in flight per CTA,
  // and its next copies wait for whatever stands between the barrier and them
  // (docs/kernels/kv-cache.md). The prefill tiles find them after the barrier, with the loader code
  // they had before: at d = 64 (where they take the paged fast paths) a restructured loader made the
  // compute-bound prefill 3-5% slower, with the rows found ahead or after the barrier alike (H200,
  // 2026-11-29; its SASS differed in ~700 of ~7100 instructions).
  constexpr bool kRowsAhead = kPagedFastPaths && kBlockM == 64;
  constexpr int kThreadRows = decltype(size<1>(tKVc))::value;
  struct TileRows {
    const Element* row[kThreadRows];
  };
  // A paged K/V tile: its pages' entries (which must be visible: fetched a tile ahead or before the
  // loop, sm80/paged_tiles.cuh) and the thread's first row counted from the start of its first page.
  struct PagedTile {
    TilePageSpan span;
    const std::int32_t* pages;
    int first_key;  // this thread's first row of the tile
    int offset0;
  };
  auto paged_tile = [&](int tile) {
    PagedTile t;
    t.first_key = tile * kBlockN + kv_row0;
    t.span = Pages::span(params, first_row, blk.seq.len_k, tile);
    t.pages = Pages::entries(page_slots, tile);
    t.offset0 = first_row + t.first_key - t.span.page0 * params.kv.pages.page_size;
    return t;
  };
  // A tile within one page (pages of >= kBlockN rows, mostly): its rows run as contiguous ones
  // from this thread's first piece.
  auto one_page_first_piece = [&](const Element* seq_base, const detail::SeqTensor& layout, const PagedTile& t) {
    return seq_base + std::int64_t(std::uint32_t(t.pages[0])) * layout.batch_stride + t.offset0 * layout.seq_stride +
           kv_col0;
  };
  // The tile's other cases: the page (page[m]) and row within it (row_in_page[m]) of each of the
  // thread's rows; rows past the sequence take the tile's first page. Each page-size case only finds
  // the pages; the page entries are all read before the first is used.
  auto find_pages = [&](const PagedTile& t, std::uint32_t (&page)[kThreadRows], int (&row_in_page)[kThreadRows]) {
    const int page_size = params.kv.pages.page_size;
    // locate(m, row) -> {slot, row within the page} of the thread's m-th row.
    auto read_pages = [&](auto&& locate) {
      CUTE_UNROLL
      for (int m = 0; m < kThreadRows; ++m) {
        const int row = get<0>(tKVc(0, m, 0)) - kv_row0;  // compile-time
        const int2 at = locate(m, row);
        page[m] = std::uint32_t(t.pages[t.first_key + row < blk.seq.len_k ? at.x : 0]);
        row_in_page[m] = at.y;
      }
    };
    if (page_size == kRowStep) {
      // A thread's rows are one page apart: the same row of successive pages, slots slot0 + m,
      // slot0 0 or 1 (offset0 < page_size + kRowStep). The set is read with 16-byte loads
      // before any entry is used: read entry by entry, ptxas fed each read straight into its
      // row's address before issuing the next (SASS, d = 128, 2026-11-29; docs/kernels/kv-cache.md).
      static_assert(kThreadRows + 1 <= Pages::kSlots);
      const typename Pages::Set set = Pages::load_set(t.pages);
      const bool next_page = t.offset0 >= page_size;
      CUTE_UNROLL
      for (int m = 0; m < kThreadRows; ++m) {
        const int row = get<0>(tKVc(0, m, 0)) - kv_row0;  // compile-time
        const std::uint32_t entry = next_page ? set.entry[m + 1] : set.entry[m];
        page[m] = t.first_key + row < blk.seq.len_k ? entry : set.entry[0];
        row_in_page[m] = next_page ? t.offset0 - page_size : t.offset0;
      }
    } else if (kRowStep != 16 && page_size == 16) {
      // A thread's rows are kRowStep apart: the same row of every (kRowStep / 16)-th page.
      const int slot0 = Pages::page_of(params, t.offset0), step = kRowStep / 16;
      read_pages([&](int m, int) { return make_int2(slot0 + m * step, t.offset0 - slot0 * page_size); });
    } else {
      read_pages([&](int, int row) {
        const int slot = Pages::page_of(params, t.offset0 + row);
        return make_int2(slot, t.offset0 + row - slot * page_size);
      });
    }
  };
  auto page_row = [&](const Element* seq_base, const detail::SeqTensor& layout, std::uint32_t page, int row_in_page) {
    return seq_base + std::int64_t(page) * layout.batch_stride +
           std::int64_t(std::uint32_t(row_in_page)) * layout.seq_stride + kv_col0;
  };
  // Rows as contiguous ones from a first piece; rows past the sequence take the head's first row.
  auto contiguous_row = [&](const Element* first_piece, const Element* seq_base, std::int64_t seq_stride, int row,
                            bool valid) { return valid ? first_piece + row * seq_stride : seq_base; };
  // The thread's rows of K/V tile `tile` through its pages (the decode tiles, ahead of the wait).
  auto locate_paged_rows = [&](const Element* seq_base, const detail::SeqTensor& layout, int tile) {
    TileRows rows;
    const PagedTile t = paged_tile(tile);
    if (t.span.pages == 1) {
      const Element* first_piece = one_page_first_piece(seq_base, layout, t);
      CUTE_UNROLL
      for (int m = 0; m < kThreadRows; ++m) {
        const int row = get<0>(tKVc(0, m, 0)) - kv_row0;  // compile-time
        rows.row[m] = contiguous_row(first_piece, seq_base, layout.seq_stride, row, t.first_key + row < blk.seq.len_k);
      }
      return rows;
    }
    std::uint32_t page[kThreadRows];
    int row_in_page[kThreadRows];
    find_pages(t, page, row_in_page);
    CUTE_UNROLL
    for (int m = 0; m < kThreadRows; ++m) rows.row[m] = page_row(seq_base, layout, page[m], row_in_page[m]);
    return rows;
  };
  // The decode tiles' row addresses of a tile about to be issued, found before the wait that
  // precedes its copies (contiguous rows too: ~190 instructions of 64-bit row addresses stood
  // between the barrier and the first copy; SASS, 2026-11-29). Nothing for the prefill tiles.
  auto locate_rows = [&](const Element* seq_base, const detail::SeqTensor& layout, int tile) {
    TileRows rows{};
    if constexpr (kRowsAhead) {
      if (params.kv.paged()) return locate_paged_rows(seq_base, layout, tile);
      const int first_key = tile * kBlockN + kv_row0;  // this thread's first row of the tile
      const Element* first_piece = seq_base + first_key * layout.seq_stride + kv_col0;
      CUTE_UNROLL
      for (int m = 0; m < kThreadRows; ++m) {
        const int row = get<0>(tKVc(0, m, 0)) - kv_row0;  // compile-time
        rows.row[m] = contiguous_row(first_piece, seq_base, layout.seq_stride, row, first_key + row < blk.seq.len_k);
      }
    }
    return rows;
  };
  // Issues the thread's copies of K/V tile `tile`: the decode tiles' at the rows locate_rows found,
  // the prefill tiles' found here.
  auto load_kv_tile = [&](auto& smem_part, const Element* seq_base, const detail::SeqTensor& layout, int tile,
                          [[maybe_unused]] const TileRows& located) {
    const std::int64_t seq_stride = layout.seq_stride;
    const int first_key = tile * kBlockN + kv_row0;  // this thread's first row of the tile
    if constexpr (kRowsAhead) {
      load_rows(smem_part, first_key, [&](int m, int, bool) { return located.row[m]; });
      return;
    }
    const Element* first_piece = seq_base + first_key * seq_stride + kv_col0;
    if (params.kv.paged()) {
      // Rows through the tile's pages, fetched one tile ahead (sm80/paged_tiles.cuh). Rows past
      // the sequence are zero-filled; their (unused) address is taken in the tile's first page.
      const TilePageSpan span = Pages::span(params, first_row, blk.seq.len_k, tile);
      const std::int32_t* pages = Pages::entries(page_slots, tile);
      const int page_size = params.kv.pages.page_size;
      // The thread's first row, counted from the start of the tile's first page.
      const int offset0 = first_row + first_key - span.page0 * page_size;
      if constexpr (!kPagedFastPaths) {
        load_rows(smem_part, first_key, [&](int, int row, bool valid) {
          const int slot = Pages::page_of(params, offset0 + row);
          return seq_base + std::int64_t(std::uint32_t(pages[valid ? slot : 0])) * layout.batch_stride +
                 std::int64_t(std::uint32_t(offset0 + row - slot * page_size)) * seq_stride + kv_col0;
        });
        return;
      } else if (span.pages == 1) {  // rows as contiguous, from the page's first piece
        first_piece = one_page_first_piece(seq_base, layout, PagedTile{span, pages, first_key, offset0});
      } else {
        std::uint32_t page[kThreadRows];
        int row_in_page[kThreadRows];
        find_pages(PagedTile{span, pages, first_key, offset0}, page, row_in_page);
        load_rows(smem_part, first_key,
                  [&](int m, int, bool) { return page_row(seq_base, layout, page[m], row_in_page[m]); });
        return;
      }
    }
    // A thread's pieces of a K/V tile lie at fixed offsets from its first one (rows a fixed step
    // apart, columns kSmemRowElems apart): one pointer per tile, and per piece a constant offset
    // that the copy takes as an immediate. Computing every piece's address from its (row, column)
    // cost ~4 instructions a piece at every tile, between the barrier and the GEMMs
    // (docs/log/sm80-forward.md, 2026-11-26: K/V tile addresses).
    load_rows(smem_part, first_key,
              [&](int, int row, bool valid) { return valid ? first_piece + row * seq_stride : seq_base; });
  };
  // block_table entries of tile `tile` - 1, fetched with K(tile)'s copies in the decode tiles,
  // with V(tile)'s in the prefill tiles (sm80/paged_tiles.cuh).
  auto fetch_pages_before = [&](int tile) {
    if (params.kv.paged() && tile > blk.tiles.begin)
      Pages::fetch(params, page_slots, blk.batch, Pages::span(params, first_row, blk.seq.len_k, tile - 1), tile - 1,
                   tid);
  };

  // ---- register fragments and shared -> register copies -------------------------------------
  Tensor tSrQ = thr_mma.partition_fragment_A(sQ);
  Tensor tSrK = thr_mma.partition_fragment_B(sK);
  Tensor tOrVt = thr_mma.partition_fragment_B(sVtPlain);
  Tensor acc_o = partition_fragment_C(tiled_mma, Shape<Int<kBlockM>, Int<kHeadDim>>{});
  clear(acc_o);
  Tensor acc_o_rc = rowcol_view(acc_o);

  auto smem_copy_q = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, tiled_mma);
  auto smem_thr_q = smem_copy_q.get_thread_slice(tid);
  Tensor tSsQ = smem_thr_q.partition_S(sQ);
  auto smem_copy_k = make_tiled_copy_B(typename Traits::SmemCopyAtom{}, tiled_mma);
  auto smem_thr_k = smem_copy_k.get_thread_slice(tid);
  Tensor tSsK = smem_thr_k.partition_S(sK);
  auto smem_copy_v = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, tiled_mma);
  auto smem_thr_v = smem_copy_v.get_thread_slice(tid);
  Tensor tOsVt = smem_thr_v.partition_S(sVt);

  // A warp whose rows all lie past the block's rows only loads and synchronizes: decoding with
  // 4 GQA-packed rows in a 64-row tile leaves three of four warps without one, and their GEMMs
  // would read whole K and V tiles from shared memory for rows nobody stores.
  bool warp_has_rows = false;
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) warp_has_rows |= get<0>(score_coords(r, 0)) < blk.rows;
  warp_has_rows = __any_sync(0xffffffffu, warp_has_rows);

  // ---- main loop over key tiles, last to first ---------------------------------------------
  if (params.kv.paged()) {  // the first tile's pages landed (not Q: it lands with the first K)
    cp_async_wait_committed();
    __syncthreads();
  }
  load_kv_tile(tKsK, k_seq, params.k_layout, blk.tiles.end - 1,
               locate_rows(k_seq, params.k_layout, blk.tiles.end - 1));
  if constexpr (kRowsAhead) fetch_pages_before(blk.tiles.end - 1);
  cp_async_commit();
  OnlineSoftmax<kRows> softmax;
  [[maybe_unused]] DropoutStream dropout_rng;
  [[maybe_unused]] Tensor score_coords_acc =
      thr_mma.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
  if constexpr (kDropout) dropout_rng = DropoutStream::load(params.dropout, params.heads_q);

  for (int tile = blk.tiles.end - 1; tile >= blk.tiles.begin; --tile) {
    Tensor acc_s = partition_fragment_C(tiled_mma, Shape<Int<kBlockM>, Int<kBlockN>>{});
    clear(acc_s);
    const TileRows v_rows = locate_rows(v_seq, params.v_layout, tile);  // while K(tile) is in flight
    cp_async_wait<0>();  // K(tile) (and Q, and the pages of tile - 1) landed
    __syncthreads();     // ...for every thread, and every warp is done reading V(tile + 1)
    load_kv_tile(tVsV, v_seq, params.v_layout, tile, v_rows);
    if constexpr (!kRowsAhead) fetch_pages_before(tile);
    cp_async_commit();

    Tensor scores = rowcol_view(acc_s);
    if (warp_has_rows) {
      gemm_smem_smem(acc_s, tSrQ, tSrK, tSsQ, tSsK, tiled_mma, smem_copy_q, smem_thr_q, smem_copy_k,
                     smem_thr_k);

      if (params.softcap_input != 0.f) {
        CUTE_UNROLL
        for (int i = 0; i < size(acc_s); ++i) acc_s(i) = accurate_tanh(acc_s(i) * params.softcap_input);
      } else if (params.negate_scores) {
        CUTE_UNROLL
        for (int i = 0; i < size(acc_s); ++i) acc_s(i) = -acc_s(i);
      }
      if (params.alibi.enabled()) {  // a uniform branch per tile (cuda/common/alibi.cuh)
        const int key0 = tile * kBlockN;
        // Opaque copies: the per-row terms below would otherwise be hoisted out of the tile loop
        // and held in registers across it, on every path (this kernel already spills a little).
        int row0 = blk.row0, batch = blk.batch, shift = blk.seq.len_k - blk.seq.len_q;
        asm volatile("" : "+r"(row0), "+r"(batch), "+r"(shift));
        add_alibi(
            scores, [&](int r) { return blk.query_row(params, row0 + get<0>(score_coords(r, 0))) + shift; },
            [&](int r, int c) { return key0 + get<1>(score_coords(r, c)); },
            [&](int r) {  // rows past the block (packed: heads past the group) get none
              const int row = get<0>(score_coords(r, 0));
              return row < blk.rows
                         ? params.alibi_to_logit * params.alibi.slope(batch, blk.query_head(params, row0 + row))
                         : 0.0f;
            });
      }
      if (!blk.mask.tile_fully_visible(tile, kBlockN)) {
        // The visible keys of each of the thread's rows (recomputed here: cheaper than keeping
        // them in registers across the loop).
        detail::KeyRange row_keys[kRows];
        CUTE_UNROLL
        for (int r = 0; r < kRows; ++r)
          row_keys[r] = blk.mask.row_keys(blk.query_row(params, blk.row0 + get<0>(score_coords(r, 0))));
        const int key0 = tile * kBlockN;
        mask_scores(scores, [&](int r, int c) { return key0 + get<1>(score_coords(r, c)); }, row_keys);
      }
    }

    TileRows k_rows{};
    if (tile > blk.tiles.begin) k_rows = locate_rows(k_seq, params.k_layout, tile - 1);  // while V(tile) is in flight
    cp_async_wait<0>();  // V(tile) landed
    __syncthreads();     // ...for every thread, and every warp is done reading K(tile)
    if (tile > blk.tiles.begin) {
      load_kv_tile(tKsK, k_seq, params.k_layout, tile - 1, k_rows);
      if constexpr (kRowsAhead) fetch_pages_before(tile - 1);
      cp_async_commit();
    }

    if (warp_has_rows) {
      softmax.step(scores, acc_o_rc, params.scale_log2, tile == blk.tiles.end - 1);
      if constexpr (kDropout)  // the forward's warps span the tile's keys from a multiple of 32
        apply_dropout<true>(acc_s, score_coords_acc, dropout_rng, blk.batch, blk.head_block, blk.row0,
                            tile * kBlockN);
      Tensor p = convert_fragment<Element>(acc_s);
      Tensor tOrP = make_tensor(p.data(), accumulator_as_a_operand_layout(p.layout()));
      gemm_reg_smem(acc_o, tOrP, tOrVt, tOsVt, tiled_mma, smem_copy_v, smem_thr_v);
    }
  }

  // ---- epilogue ----------------------------------------------------------------------------
  float lse[kRows];
  softmax.finalize(acc_o_rc, params.logit_scale, lse);
  if constexpr (kDropout) {
    CUTE_UNROLL
    for (int i = 0; i < size(acc_o); ++i) acc_o(i) *= params.dropout.keep_scale;
  }

  if (params.num_splits > 1) {
    // fp32 partial output and LSE of this split, straight from registers.
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const int row_in_tile = get<0>(out_coords(r, 0));
      if (row_in_tile >= blk.rows) continue;
      const int row = blk.row0 + row_in_tile;
      const std::int64_t prow = partial_row(params, blk.split, blk.batch,
                                            blk.query_head(params, row), blk.query_row(params, row));
      float* dst = params.partial_out + prow * kHeadDim;
      CUTE_UNROLL
      for (int c = 0; c < size<1>(acc_o_rc); c += 2)
        *reinterpret_cast<float2*>(dst + get<1>(out_coords(r, c))) =
            make_float2(acc_o_rc(r, c), acc_o_rc(r, c + 1));
      if (get<1>(out_coords(r, 0)) == 0) params.partial_lse[prow] = lse[r];
    }
    return;
  }

  // O through shared memory (over Q, which no warp reads any more) for 16-byte row stores.
  __syncthreads();
  Tensor sO = make_tensor(sQ.data(), typename Traits::SmemLayoutQ{});
  Tensor rO = convert_fragment<Element>(acc_o);
  auto smem_copy_o = make_tiled_copy_C(typename Traits::SmemCopyAtomO{}, tiled_mma);
  auto smem_thr_o = smem_copy_o.get_thread_slice(tid);
  copy(smem_copy_o, smem_thr_o.retile_S(rO), smem_thr_o.partition_D(sO));
  __syncthreads();
  store_out_rows([&](int m, int k) { return *reinterpret_cast<const uint4*>(&tQsQ(0, m, k)); });
  if (params.lse != nullptr) {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const int row_in_tile = get<0>(out_coords(r, 0));
      if (get<1>(out_coords(r, 0)) != 0 || row_in_tile >= blk.rows) continue;
      const int row = blk.row0 + row_in_tile;
      params.lse[lse_index(params.lse_layout, blk.batch, blk.seq.offset_q, blk.query_row(params, row),
                           blk.query_head(params, row))] = lse[r];
    }
  }
}

}  // namespace flashattn::cuda::sm80
