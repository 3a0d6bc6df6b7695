#pragma once
// Split-KV combine: merges the fp32 partial outputs and LSEs that the splits of one query row
// wrote into the final output (Element) and LSE:
//   lse = log(sum_s exp(lse_s)),  out = sum_s exp(lse_s - lse) * out_s
// A row whose splits all saw no key gets out 0 and LSE -inf.
#include <cute/config.hpp>
#include <cutlass/array.h>

#include "cuda/sm80/forward_params.hpp"

namespace flashattn::cuda::sm80 {

// One row per kHeadDim / 4 threads, each owning 4 consecutive columns; about 128 threads a CTA.
template <int kHeadDim>
struct CombineShape {
  static constexpr int kThreadsPerRow = kHeadDim / 4;
  static constexpr int kRowsPerCta = 128 / kThreadsPerRow > 0 ? 128 / kThreadsPerRow : 1;
  static constexpr int kThreads = kRowsPerCta * kThreadsPerRow;
};

template <class Element, int kHeadDim>
__global__ void __launch_bounds__(CombineShape<kHeadDim>::kThreads)
    combine_splits_kernel(const __grid_constant__ ForwardParams params) {
  constexpr int kThreadsPerRow = CombineShape<kHeadDim>::kThreadsPerRow;
  constexpr int kRowsPerCta = CombineShape<kHeadDim>::kRowsPerCta;

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

  float max_lse = -INFINITY;
  for (int s = 0; s < params.num_splits; ++s)
    max_lse = fmaxf(max_lse, params.partial_lse[s * rows_per_split + row]);

  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  float lse = -INFINITY;
  if (max_lse != -INFINITY) {
    float sum = 0.f;
    for (int s = 0; s < params.num_splits; ++s)
      sum += __expf(params.partial_lse[s * rows_per_split + row] - max_lse);
    lse = max_lse + __logf(sum);
    for (int s = 0; s < params.num_splits; ++s) {
      const float lse_s = params.partial_lse[s * rows_per_split + row];
      if (lse_s == -INFINITY) continue;  // an empty split: contributes nothing
      const float w = __expf(lse_s - lse);
      const float4 o = *reinterpret_cast<const float4*>(
          params.partial_out + (s * rows_per_split + row) * kHeadDim + col);
      acc.x += w * o.x;
      acc.y += w * o.y;
      acc.z += w * o.z;
      acc.w += w * o.w;
    }
  }

  Element* dst = static_cast<Element*>(params.out) +
                 element_index(params.out_layout, b, seq.offset_q, i, h) + col;
  cutlass::Array<Element, 4> packed;
  packed[0] = Element(acc.x);
  packed[1] = Element(acc.y);
  packed[2] = Element(acc.z);
  packed[3] = Element(acc.w);
  *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(&packed);  // 8-byte store
  if (col == 0 && params.lse != nullptr)
    params.lse[lse_index(params.lse_layout, b, seq.offset_q, i, h)] = lse;
}

}  // namespace flashattn::cuda::sm80
