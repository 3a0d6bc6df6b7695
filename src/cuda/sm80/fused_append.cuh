#pragma once
// A KV-cache call's append + rotary inside the sm80 decode kernel (forward_kernel.cuh,
// kFusedAppend), where otherwise a kernel of its own runs before the attention
// (cuda/kv_append.cu) and the attention waits for that grid to complete.
//
// Each CTA of a (sequence, KV head) writes the new rows it reads into the cache itself, K rotated
// and V copied, before its first K/V load, and reads them back only after its own writes and a
// barrier, so no CTA waits for another; the CTAs of the last key split write all of them (the
// rows no CTA reads included). CTAs of one split that share a KV head write the same bytes, which
// is why only calls of a few new rows take this path (kFusedAppendMaxRows,
// sm80/forward_heuristics.hpp). Each CTA rotates its own query rows as it moves them into shared
// memory. Both go through common/rotary.cuh, as the separate kernel does, so the bits are the same
// either way. What it saves, and the arrangements that measured slower (all those that issue the
// first K tile's copies before the moves are done among them): docs/kernels/kv-cache.md.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cutlass/numeric_types.h>

#include <type_traits>

#include "common/kv_layout.hpp"
#include "cuda/common/rotary.cuh"
#include "cuda/sm80/forward_params.hpp"

namespace flashattn::cuda::sm80 {

// The CUDA type with the layout of a kernel element type, for common/rotary.cuh.
template <class Element>
using CudaScalar = std::conditional_t<std::is_same_v<Element, cutlass::half_t>, __half, __nv_bfloat16>;

// Writes new rows [cache_seqlens[batch], + seqlen_new) of one KV head into the cache: all of them
// in a CTA of the last key split, elsewhere only those inside the CTA's key rows [key_begin,
// key_end) (storage row = offset_k + key). Every CTA thus writes the rows it reads, and every row
// is written, also rows no CTA reads (a window may hide them); decoding's other splits skip the
// moves' round trip before their first K tile.
template <class Element>
__device__ void append_new_rows(const ForwardParams& p, int batch, int kv_batch, int kv_head, bool last_split,
                                std::int64_t offset_k, int key_begin, int key_end, int tid, int threads) {
  using T = CudaScalar<Element>;
  const detail::KvAppend& a = p.fused_append;
  if (!a.appends()) return;
  const int d = p.cols.dim, pairs = (d + 1) / 2;
  const int first_row = a.cache_seqlens[batch];
  const int first_key = first_row - int(offset_k);  // new row i is key first_key + i
  const int i_begin = last_split ? 0 : max(0, key_begin - first_key);
  const int i_end = last_split ? a.seqlen_new : min(a.seqlen_new, key_end - first_key);
  for (int t = tid + i_begin * pairs; t < i_end * pairs; t += threads) {
    const int i = t / pairs, j = t - i * pairs;
    const int row = first_row + i;  // its storage row, and its rotary position
    T* k_row = cache_row<T>(p.k, p.k_layout, p.kv.pages, batch, kv_batch, row, kv_head);
    T* v_row = cache_row<T>(p.v, p.v_layout, p.kv.pages, batch, kv_batch, row, kv_head);
    copy_row_pair(a, new_row<T>(a.k_new, batch, i, kv_head), d, d, row, a.rotates(), j,
                  [&](int c, T x) { k_row[c] = x; });
    copy_row_pair(a, new_row<T>(a.v_new, batch, i, kv_head), d, d, row, false, j, [&](int c, T x) { v_row[c] = x; });
  }
}

// Where tile row r of the queries comes from: its element index in q, its query row.
struct QueryRowSource {
  std::int64_t index;
  int query_row;
};

// Writes the tile's query rows [0, rows) into sQ (kHeadDim columns, those from the head dim on
// 0), each rotated at its query position; row_source(r) -> QueryRowSource.
template <class Element, int kHeadDim, class SmemQ, class RowSource>
__device__ void load_rotated_queries(const ForwardParams& p, int batch, int rows, SmemQ& sQ, RowSource&& row_source,
                                     int tid, int threads) {
  using T = CudaScalar<Element>;
  const detail::KvAppend& a = p.fused_append;
  constexpr int kPairs = kHeadDim / 2;
  for (int t = tid; t < rows * kPairs; t += threads) {
    const int r = t / kPairs, j = t % kPairs;
    const QueryRowSource source = row_source(r);
    copy_row_pair(a, static_cast<const T*>(p.q) + source.index, p.cols.dim, kHeadDim,
                  a.query_position(batch, source.query_row),
                  true, j, [&](int c, T x) { *reinterpret_cast<T*>(&sQ(r, c)) = x; });
  }
}

}  // namespace flashattn::cuda::sm80
