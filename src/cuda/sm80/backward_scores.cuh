#pragma once
// The element-wise middle of the backward, on a thread's share of one (query rows x keys)
// tile: recomputes P from S and the saved LSE, and turns dP into dS.
//   x  = S * scale                          or  softcap * tanh(S * scale / softcap)
//   x += ALiBi bias                         (when given: cuda/common/alibi.cuh)
//   P  = exp(x - LSE)                       (0 where masked, and on rows that see no key)
//   dS = P * (dP - D)                       or  P * (dP - D) * (1 - tanh^2)
// The softmax scale (and the chain rule's d(S*scale)/dS) is applied to dK and dQ once, later.
// Everything runs in base 2: the LSE arrives multiplied by log2(e) (+inf where it was -inf).
#include <cute/tensor.hpp>

#include "cuda/common/alibi.cuh"
#include "cuda/common/mask.cuh"

namespace flashattn::cuda::sm80 {

// tanh to a few float ulps. (Under --use_fast_math tanhf becomes tanh.approx, about 2^-11
// relative, too coarse for fp16 gradients through a softcap.) Saturates cleanly to +-1.
__device__ __forceinline__ float tanh_accurate(float x) {
  const float e2x = __expf(fminf(2.0f * x, 80.0f));
  return 1.0f - __fdividef(2.0f, e2x + 1.0f);
}

struct ScoreTransform {
  float scale_log2;        // scale * log2(e), without softcap
  float softcap_inner;     // scale / softcap
  float softcap_outer_log2;  // softcap * log2(e)

  static __device__ __forceinline__ ScoreTransform make(float scale, float softcap) {
    constexpr float kLog2e = 1.4426950408889634f;
    ScoreTransform t;
    t.scale_log2 = scale * kLog2e;
    t.softcap_inner = softcap > 0 ? scale / softcap : 0.0f;
    t.softcap_outer_log2 = softcap * kLog2e;
    return t;
  }
};

// s, dp: accumulators in rows/cols view (rowcol_view); coords: the same view of an identity
// tensor (tile-local (row, key)); lse_log2, delta: per row of the view; mask: the tile's query
// rows (mask.first_row is the tile's first row); key0: the tile's first key; bias(r, key): a
// base-2 term added to the exponent (NoScoreBias, or ALiBi's AlibiRowsLog2). On return s holds
// P and dp holds dS.
template <bool kMasked, bool kSoftcap, class S, class DP, class Coords, int kRows, class Bias = NoScoreBias>
__device__ __forceinline__ void scores_to_gradients(S& s, DP& dp, const Coords& coords,
                                                    const float (&lse_log2)[kRows],
                                                    const float (&delta)[kRows],
                                                    const ScoreTransform& tf,
                                                    const BlockMask& mask, int key0,
                                                    const Bias& bias = {}) {
  using namespace cute;
  static_assert(decltype(size<0>(s))::value == kRows);
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    detail::KeyRange keys{0, 0};
    if constexpr (kMasked) keys = mask.row_keys(mask.first_row + get<0>(coords(r, 0)));
    CUTE_UNROLL
    for (int c = 0; c < size<1>(s); ++c) {
      float prob, dtanh = 1.0f;
      float offset = -lse_log2[r];
      if constexpr (Bias::kEnabled) offset += bias(r, key0 + get<1>(coords(r, c)));
      if constexpr (kSoftcap) {
        const float t = tanh_accurate(s(r, c) * tf.softcap_inner);
        prob = exp2f(fmaf(t, tf.softcap_outer_log2, offset));
        dtanh = 1.0f - t * t;
      } else {
        prob = exp2f(fmaf(s(r, c), tf.scale_log2, offset));
      }
      if constexpr (kMasked) {
        const int key = key0 + get<1>(coords(r, c));
        if (key < keys.begin || key >= keys.end) prob = 0.0f;
      }
      s(r, c) = prob;
      if constexpr (kSoftcap) {
        dp(r, c) = prob * (dp(r, c) - delta[r]) * dtanh;
      } else {
        dp(r, c) = prob * (dp(r, c) - delta[r]);
      }
    }
  }
}

// Loads LSE*log2(e) and D for the rows of a thread's rows/cols view (coords: tile-local).
// Rows at or beyond `valid_rows` get LSE = +inf and D = 0, so their P and dS are exactly 0.
template <class Coords, int kRows>
__device__ __forceinline__ void load_row_stats(float (&lse_log2)[kRows], float (&delta)[kRows],
                                               const Coords& coords, const float* lse_rows,
                                               const float* delta_rows, int valid_rows) {
  using namespace cute;
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    const int row = get<0>(coords(r, 0));
    const bool valid = row < valid_rows;
    lse_log2[r] = valid ? lse_rows[row] : INFINITY;
    delta[r] = valid ? delta_rows[row] : 0.0f;
  }
}

// ALiBi of a backward tile: rows row0 + (tile-local row) of query head `head` of sequence `b`.
template <int kRows, class Coords>
__device__ __forceinline__ AlibiRowsLog2<kRows> alibi_rows(const detail::AlibiSlopes& alibi, int b, int head,
                                                          const Coords& coords, int row0, int len_q,
                                                          int len_k) {
  using namespace cute;
  constexpr float kLog2e = 1.4426950408889634f;
  AlibiRowsLog2<kRows> a;
  a.minus_slope_log2 = -kLog2e * alibi.slope(b, head);
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) a.diag[r] = row0 + get<0>(coords(r, 0)) + len_k - len_q;
  return a;
}

}  // namespace flashattn::cuda::sm80
