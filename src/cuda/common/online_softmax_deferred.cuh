#pragma once
// Online softmax that leaves the rescaling of the output accumulator to the caller, so that a
// kernel can run it while a GEMM is in flight (FlashAttention-3's intra-warpgroup overlap:
// step() on the scores of key tile j+1 returns the correction that O needs before P_j+1 V_j+1
// is added). The 4 lanes of a quad share each row, as in mma.sync and wgmma accumulators.
//
// Scores arrive in logit units x; a probability is exp2(x * scale_log2 - max * scale_log2).
// A row that has seen only masked (-inf) scores keeps max = -inf and offset 0, so that its
// probabilities are exp2(-inf) = 0; finalize() gives it output 0 and LSE -inf.
//
// FlashAttention-4's two softmax options, both compile-time:
//  - kPolyEvery > 0: every kPolyEvery-th probability of a row comes from exp2_poly on the FMA
//    pipe instead of MUFU.EX2, so that the special-function unit is not the bottleneck;
//  - kLazyRescale: the running max moves only when a tile's max exceeds it by more than
//    kRescaleThreshold (log2 units); below that, probabilities may reach 2^threshold, which
//    fp32 sums and bf16/fp16 P hold easily, and O needs no rescale. A warp skips the rescale
//    when none of its rows moved.
//
// kProbLog2Shift > 0 (the FP8 forward): probabilities are 2^shift times larger, exp2(x - max +
// shift), so that an e4m3 P keeps its small entries out of the subnormal range; the row sums
// carry the same factor, so the normalized output does not change, and the LSE subtracts it.
//
// step() may take one positive factor per group of consecutive columns (the FP8 forward's K
// factors under block quantization, sm90/fp8_key_scales.cuh): the scores count as multiplied by
// them, at no instruction per score: a group's max is taken on the raw scores and then scaled,
// and the factor joins the exponent's FFMA multiplier.
#include <cute/tensor.hpp>

#include "cuda/common/fast_exp2.cuh"
#include "cuda/common/fragment.cuh"

namespace flashattn::cuda {

template <int kRows, int kPolyEvery = 0, bool kLazyRescale = false, int kProbLog2Shift = 0>
class DeferredOnlineSoftmax {
 public:
  static constexpr float kRescaleThreshold = 8.f;

  // O (row r) must be multiplied by factor[r] before the next P.V is accumulated, unless
  // `needed` is false (then every factor is 1).
  struct Correction {
    float factor[kRows];
    bool needed;
  };

  CUTE_DEVICE explicit DeferredOnlineSoftmax(float scale_log2) : scale_log2_(scale_log2) { reset(); }

  // A new score scale (the FP8 forward: each tile's descale factors fold into it); call before
  // the tile's first step.
  CUTE_DEVICE void set_scale_log2(float scale_log2) { scale_log2_ = scale_log2; }

  CUTE_DEVICE void reset() {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      row_max_[r] = -INFINITY;
      row_sum_[r] = 0.f;
    }
  }

  // scores: (kRows, cols) logits of one key tile, replaced by unnormalized probabilities.
  template <bool kFirst, class Scores>
  CUTE_DEVICE Correction step(Scores& scores) {
    const float one[1] = {1.f};
    return step<kFirst>(scores, one);
  }

  // The same with the scores of column group g (cols / kGroups consecutive columns) multiplied by
  // group_factor[g] > 0.
  template <bool kFirst, class Scores, int kGroups>
  CUTE_DEVICE Correction step(Scores& scores, const float (&group_factor)[kGroups]) {
    using namespace cute;
    static_assert(decltype(size<0>(scores))::value == kRows);
    constexpr int kCols = decltype(size<1>(scores))::value, kGroupCols = kCols / kGroups;
    static_assert(kCols % kGroups == 0);
    float group_scale_log2[kGroups];
#pragma unroll
    for (int g = 0; g < kGroups; ++g) group_scale_log2[g] = scale_log2_ * group_factor[g];
    Correction corr;
    bool moved = false;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float tile_max = -INFINITY;
      if constexpr (kGroups == 1) {  // the plain step: one chain (a factor of 1 compiles away)
#pragma unroll
        for (int c = 0; c < kCols; ++c) tile_max = fmaxf(tile_max, scores(r, c));
        tile_max *= group_factor[0];
      } else {
#pragma unroll
        for (int g = 0; g < kGroups; ++g) {
          float group_max = -INFINITY;
#pragma unroll
          for (int c = g * kGroupCols; c < (g + 1) * kGroupCols; ++c) group_max = fmaxf(group_max, scores(r, c));
          tile_max = fmaxf(tile_max, group_max * group_factor[g]);
        }
      }
      tile_max = lane_group_allreduce<4>(tile_max, MaxOp{});
      float new_max = fmaxf(row_max_[r], tile_max);
      if constexpr (kLazyRescale) {
        // Keep the old max while the growth is small (also when both are -inf: NaN > x is false).
        if (!kFirst && !((new_max - row_max_[r]) * scale_log2_ > kRescaleThreshold)) new_max = row_max_[r];
      }
      const float offset = new_max == -INFINITY ? 0.f : new_max * scale_log2_;
      corr.factor[r] = kFirst ? 1.f : exp2_sfu(row_max_[r] * scale_log2_ - offset);
      moved |= corr.factor[r] != 1.f;
      row_max_[r] = new_max;
      row_sum_[r] *= corr.factor[r];
      float sum = 0.f;
      const float shifted_offset = offset - float(kProbLog2Shift);
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        const float x = fmaf(scores(r, c), group_scale_log2[c / kGroupCols], -shifted_offset);
        float p;
        if constexpr (kPolyEvery > 0)
          p = c % kPolyEvery == kPolyEvery - 1 ? exp2_poly(x) : exp2_sfu(x);
        else
          p = exp2_sfu(x);
        scores(r, c) = p;
        sum += p;
      }
      row_sum_[r] += sum;
    }
    if constexpr (kFirst) {
      corr.needed = false;
    } else if constexpr (kLazyRescale) {
      corr.needed = __any_sync(0xffffffffu, moved);
    } else {
      corr.needed = true;
    }
    return corr;
  }

  // acc: (kRows, cols) output accumulator.
  template <class Acc>
  CUTE_DEVICE static void rescale(Acc& acc, Correction const& corr) {
    using namespace cute;
    if (!corr.needed) return;
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int c = 0; c < size<1>(acc); ++c) acc(r, c) *= corr.factor[r];
  }

  // Row r's running max (logit units) and this thread's part of its sum.
  CUTE_DEVICE float max(int r) const { return row_max_[r]; }
  CUTE_DEVICE float sum(int r) const { return row_sum_[r]; }

  // Merges the state of the same rows over another range of keys (its max and this thread's
  // part of its sum): the output of this range must then be scaled by mine[r] and the other's by
  // theirs[r] before they are added. A row that saw no key in either range keeps max -inf.
  CUTE_DEVICE void merge(const float (&other_max)[kRows], const float (&other_sum)[kRows], float (&mine)[kRows],
                         float (&theirs)[kRows]) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float new_max = fmaxf(row_max_[r], other_max[r]);
      const float offset = new_max == -INFINITY ? 0.f : new_max * scale_log2_;
      mine[r] = exp2_sfu(row_max_[r] * scale_log2_ - offset);
      theirs[r] = exp2_sfu(other_max[r] * scale_log2_ - offset);
      row_sum_[r] = row_sum_[r] * mine[r] + other_sum[r] * theirs[r];
      row_max_[r] = new_max;
    }
  }

  // Normalizes acc and gives each row's natural-log LSE, max * logit_scale + log(sum), where
  // logit_scale converts logit units to natural-log units (scale_log2 / log2 e).
  template <class Acc>
  CUTE_DEVICE void finalize(Acc& acc, float logit_scale, float (&lse)[kRows]) const {
    using namespace cute;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float sum = lane_group_allreduce<4>(row_sum_[r], SumOp{});
      const bool empty = sum == 0.f;  // the row saw no key
      const float inv = empty ? 0.f : 1.f / sum;
      constexpr float kShiftLn = float(kProbLog2Shift) * 0.6931471805599453f;
      lse[r] = empty ? -INFINITY : row_max_[r] * logit_scale + (logf(sum) - kShiftLn);
#pragma unroll
      for (int c = 0; c < size<1>(acc); ++c) acc(r, c) *= inv;
    }
  }

 private:
  float scale_log2_;
  float row_max_[kRows];
  float row_sum_[kRows];
};

}  // namespace flashattn::cuda
