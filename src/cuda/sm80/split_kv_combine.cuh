#pragma once
// Split-KV combine: merges the fp32 partial outputs and LSEs that the splits of one query row
// wrote into the final output (Element) and LSE:
//   lse = log(sum_s exp(lse_s)),  out = sum_s exp(lse_s - lse) * out_s
// A row whose splits all saw no key gets out 0 and LSE -inf.
#include <cute/config.hpp>
#include <cutlass/array.h>

#include "cuda/common/programmatic_launch.cuh"
#include "cuda/sm80/forward_params.hpp"

namespace flashattn::cuda::sm80 {

// One row per kHeadDim / 4 threads, each owning 4 consecutive columns; about 128 threads a CTA.
template <int kHeadDim>
struct CombineShape {
  static constexpr int kThreadsPerRow = kHeadDim / 4;
  static constexpr int kRowsPerCta = 128 / kThreadsPerRow > 0 ? 128 / kThreadsPerRow : 1;
  static constexpr int kThreads = kRowsPerCta * kThreadsPerRow;
};

// Per-component helpers for a thread's 4 output columns.
CUTE_DEVICE void scale(float4& acc, float factor) {
  acc.x *= factor;
  acc.y *= factor;
  acc.z *= factor;
  acc.w *= factor;
}
CUTE_DEVICE void add_scaled(float4& acc, float w, float4 o) {
  acc.x += w * o.x;
  acc.y += w * o.y;
  acc.z += w * o.z;
  acc.w += w * o.w;
}

template <class Element, int kHeadDim>
__global__ void __launch_bounds__(CombineShape<kHeadDim>::kThreads)
    combine_splits_kernel(const __grid_constant__ ForwardParams params) {
  constexpr int kThreadsPerRow = CombineShape<kHeadDim>::kThreadsPerRow;
  constexpr int kRowsPerCta = CombineShape<kHeadDim>::kRowsPerCta;
  constexpr int kChunk = 8;  // splits whose loads are in flight together
  wait_for_previous_grid();  // the splits' partials (launched programmatically)

  // Rows are (batch, head, query row) over the padded (batch, heads_q, seqlen_q) workspace.
  const std::int64_t row = std::int64_t(blockIdx.x) * kRowsPerCta + threadIdx.x / kThreadsPerRow;
  const int col = (threadIdx.x % kThreadsPerRow) * 4;
  const std::int64_t rows_per_split = std::int64_t(params.batch) * params.heads_q * params.seqlen_q;
  if (row >= rows_per_split) return;
  const int i = int(row % params.seqlen_q);
  const int h = int(row / params.seqlen_q % params.heads_q);
  const int b = int(row / params.seqlen_q / params.heads_q);
  const SequenceSpan seq = sequence_span(params, b);
  if (i >= seq.len_q) return;

  // One pass over the splits, kChunk at a time, as an online log-sum-exp: a chunk's LSEs and
  // partial outputs are all requested before any is used, so a row costs one memory round trip
  // per chunk (one in all up to kChunk splits). The loads are unconditional: indices past the
  // last split read the last split again, with weight 0 (predicated loads were issued two at a
  // time, ptxas sm_90). An empty split has LSE -inf and wrote zeros: weight 0 as well.
  const float* row_lse = params.partial_lse + row;
  const float* row_out = params.partial_out + row * kHeadDim + col;
  const int splits = params.num_splits;
  float max_lse = -INFINITY, sum = 0.f;  // running max and sum of exp(lse_s - max_lse)
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);  // sum of exp(lse_s - max_lse) * out_s
  for (int s0 = 0; s0 < splits; s0 += kChunk) {
    float lse_s[kChunk];
    float4 o[kChunk];
#pragma unroll
    for (int u = 0; u < kChunk; ++u) {
      const std::int64_t split = min(s0 + u, splits - 1);
      lse_s[u] = row_lse[split * rows_per_split];
      o[u] = *reinterpret_cast<const float4*>(row_out + split * rows_per_split * kHeadDim);
    }
    float chunk_max = -INFINITY;
#pragma unroll
    for (int u = 0; u < kChunk; ++u) {
      if (s0 + u >= splits) lse_s[u] = -INFINITY;
      chunk_max = fmaxf(chunk_max, lse_s[u]);
    }
    if (chunk_max == -INFINITY) continue;  // no key in any of these splits
    const float new_max = fmaxf(max_lse, chunk_max);
    const float rescale = __expf(max_lse - new_max);  // 0 while nothing was seen
    max_lse = new_max;
    sum *= rescale;
    scale(acc, rescale);
#pragma unroll
    for (int u = 0; u < kChunk; ++u) {
      const float w = __expf(lse_s[u] - max_lse);
      sum += w;
      add_scaled(acc, w, o[u]);
    }
  }
  float lse = -INFINITY;
  if (max_lse != -INFINITY) {
    lse = max_lse + __logf(sum);
    scale(acc, 1.f / sum);
  }

  Element* dst = static_cast<Element*>(params.out) +
                 element_index(params.out_layout, b, seq.offset_q, i, h) + col;
  cutlass::Array<Element, 4> packed;
  packed[0] = Element(acc.x);
  packed[1] = Element(acc.y);
  packed[2] = Element(acc.z);
  packed[3] = Element(acc.w);
  // Only the problem's columns (its head dim may be below kHeadDim: common/head_columns.cuh);
  // element by element where rows are not 16-byte aligned. A uniform branch per thread.
  if (params.cols.vectors) {
    if (col < params.cols.dim) *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(&packed);  // 8-byte store
  } else {
    CUTLASS_PRAGMA_UNROLL
    for (int e = 0; e < 4; ++e)
      if (col + e < params.cols.dim) dst[e] = packed[e];
  }
  if (col == 0 && params.lse != nullptr)
    params.lse[lse_index(params.lse_layout, b, seq.offset_q, i, h)] = lse;
}

}  // namespace flashattn::cuda::sm80
