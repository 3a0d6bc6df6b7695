#pragma once
// Online softmax over key tiles (FlashAttention-2 style), for a thread that holds kRows score
// rows of an m16n8 accumulator (the 4 lanes of a quad share each row).
//
// Scores arrive in "logit units" x; the probability is exp2(x * scale_log2 - max * scale_log2),
// so the softmax scale (times log2 e) is folded into one FFMA per element. The running sum is
// kept per thread and reduced across the quad only once, in finalize(); the output accumulator
// is rescaled once per key tile, and normalized once at the end.
//
// A row that has seen only masked (-inf) scores keeps max = -inf; its exponent offset is taken
// as 0 so that exp2(-inf) = 0 rather than NaN. finalize() gives such a row (sum 0) output 0 and
// LSE -inf.
#include <cute/tensor.hpp>

#include "cuda/common/fragment.cuh"

namespace flashattn::cuda {

template <int kRows>
struct OnlineSoftmax {
  float row_max[kRows];
  float row_sum[kRows];

  CUTE_DEVICE OnlineSoftmax() {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      row_max[r] = -INFINITY;
      row_sum[r] = 0.f;
    }
  }

  // scores: (kRows, cols) logits of one key tile, replaced by unnormalized probabilities.
  // acc: (kRows, d) output accumulator, rescaled by the change of the running max unless
  // `first` (then it is still zero).
  template <class Scores, class Acc>
  CUTE_DEVICE void step(Scores& scores, Acc& acc, float scale_log2, bool first) {
    using namespace cute;
    static_assert(decltype(size<0>(scores))::value == kRows);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float tile_max = row_max[r];
#pragma unroll
      for (int c = 0; c < size<1>(scores); ++c) tile_max = fmaxf(tile_max, scores(r, c));
      tile_max = lane_group_allreduce<4>(tile_max, MaxOp{});
      const float offset = tile_max == -INFINITY ? 0.f : tile_max * scale_log2;
      if (!first) {
        const float correction = exp2f(row_max[r] * scale_log2 - offset);
        row_sum[r] *= correction;
#pragma unroll
        for (int c = 0; c < size<1>(acc); ++c) acc(r, c) *= correction;
      }
      row_max[r] = tile_max;
      float sum = 0.f;
#pragma unroll
      for (int c = 0; c < size<1>(scores); ++c) {
        const float p = exp2f(scores(r, c) * scale_log2 - offset);
        scores(r, c) = p;
        sum += p;
      }
      row_sum[r] += sum;
    }
  }

  // Normalizes acc and writes each row's natural-log LSE: max * logit_scale + log(sum), where
  // logit_scale converts logit units to natural-log units (scale_log2 / log2 e).
  template <class Acc>
  CUTE_DEVICE void finalize(Acc& acc, float logit_scale, float (&lse)[kRows]) {
    using namespace cute;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float sum = lane_group_allreduce<4>(row_sum[r], SumOp{});
      const bool empty = sum == 0.f;  // the row saw no key
      const float inv = empty ? 0.f : 1.f / sum;
      lse[r] = empty ? -INFINITY : row_max[r] * logit_scale + logf(sum);
#pragma unroll
      for (int c = 0; c < size<1>(acc); ++c) acc(r, c) *= inv;
    }
  }
};

}  // namespace flashattn::cuda
