#pragma once
// Element-wise steps on a score tile, shared by the forward and the backward. The tile is
// stored transposed, keys x queries (s[key * width + query]), so that every step on one key
// runs along a row of queries in full vectors, and so that per-query quantities (row max,
// LSE, D) are vectors too. kRows, the query block size, is the tile's row length and a
// multiple of simd::kLanes.
#include <cmath>
#include <cstdint>

#include "common/problem.hpp"
#include "cpu/simd.hpp"
#include "cpu/tile.hpp"

namespace flashattn::cpu {

// Scores outside each query row's visible range [row_begin, row_end) become -inf.
template <int kRows>
inline void mask_scores(float* s, int keys, int key0, const QueryBlockKeys<kRows>& block) {
  for (int n = 0; n < keys; ++n) {
    const int key = key0 + n;
    float* row = s + std::int64_t(n) * kRows;
    for (int m = 0; m < kRows; ++m)
      row[m] = (key >= block.row_begin[m] && key < block.row_end[m]) ? row[m] : kNegInf;
  }
}

// The query tile is pre-scaled by this, so that the product K Q^T gives the scores (or, with
// soft-capping, tanh's argument). The forward and the backward use the same factor and the
// same product, so the backward recomputes bit for bit the scores that made the forward's
// LSE: with large scores (|s| in the thousands, where fp32 keeps only about 1e-4 of absolute
// precision) P = exp(s - LSE) stays consistent with the forward's softmax.
inline float query_prescale(const detail::Problem& p) { return p.softcap > 0 ? p.scale / p.softcap : p.scale; }

// Soft-capping: s holds x = scale * q.k / softcap and becomes the score softcap * tanh(x).
// tanh(x) is kept in `tanh_out` when the backward needs it (nullptr otherwise).
inline void softcap_scores(float* s, int count, float softcap, float* tanh_out) {
  for (int i = 0; i < count; i += simd::kLanes) {
    const simd::Vec t = simd::tanh(simd::load(s + i));
    if (tanh_out) simd::store(tanh_out + i, t);
    simd::store(s + i, t * softcap);
  }
}

// ALiBi (common/alibi.hpp): adds -slope * |row + shift - key| to every score of the tile,
// shift = seqlen_k - seqlen_q of the sequence; `first_row` is the tile's first query row.
// Runs before masking (masked scores become -inf whatever was added).
template <int kRows>
inline void alibi_scores(float* s, int keys, int key0, int first_row, int shift, float slope) {
  alignas(64) float diag[kRows];
  for (int m = 0; m < kRows; ++m) diag[m] = float(first_row + m + shift);
  for (int n = 0; n < keys; ++n) {
    const simd::Vec key = simd::splat(float(key0 + n));
    for (int m = 0; m < kRows; m += simd::kLanes) {
      float* x = s + std::int64_t(n) * kRows + m;
      const simd::Vec d = simd::load(diag + m) - key;
      simd::store(x, simd::load(x) - simd::max(d, -d) * slope);
    }
  }
}

// Online softmax over the key blocks of one query block. Scores are in natural units; each
// exponential is exp2 of (score - running max) * log2(e), the difference taken first so that
// large scores lose no precision.
template <int kRows>
struct OnlineSoftmax {
  static_assert(kRows % simd::kLanes == 0);
  alignas(64) float max[kRows];    // running row max (-inf until a row sees a key)
  alignas(64) float sum[kRows];    // running sum of exp(score - max)
  alignas(64) float rescale[kRows];  // factor for the output rows after the last update

  void reset() {
    for (int m = 0; m < kRows; ++m) max[m] = kNegInf, sum[m] = 0.0f;
  }

  // Replaces the scores of `keys` keys by their probabilities relative to the new running
  // max, and sets rescale[] for the rows of the output accumulated so far. Each pass works on
  // all of a key's queries at once: the exponentials of different vectors are independent, so
  // their long polynomial chains overlap instead of waiting on each other.
  void update(float* s, int keys) {
    using simd::Vec;
    constexpr int kVecs = kRows / simd::kLanes;
    Vec new_max[kVecs];
    for (int v = 0; v < kVecs; ++v) new_max[v] = simd::load(max + v * simd::kLanes);
    for (int n = 0; n < keys; ++n)
      for (int v = 0; v < kVecs; ++v)
        new_max[v] = simd::max(simd::load(s + std::int64_t(n) * kRows + v * simd::kLanes), new_max[v]);

    // A row that has seen no key yet keeps max -inf; subtracting 0 keeps its terms 0.
    alignas(64) float base[kRows];
    for (int v = 0; v < kVecs; ++v) {
      const Vec b = new_max[v] == kNegInf ? simd::splat(0.0f) : new_max[v];
      simd::store(base + v * simd::kLanes, b);
      simd::store(rescale + v * simd::kLanes, simd::exp2((simd::load(max + v * simd::kLanes) - b) * kLog2e));
      simd::store(max + v * simd::kLanes, new_max[v]);
    }
    alignas(64) float row_sum[kRows] = {};
    for (int n = 0; n < keys; ++n)
      for (int v = 0; v < kVecs; ++v) {
        float* x = s + std::int64_t(n) * kRows + v * simd::kLanes;
        const Vec prob = simd::exp2((simd::load(x) - simd::load(base + v * simd::kLanes)) * kLog2e);
        simd::store(x, prob);
        simd::store(row_sum + v * simd::kLanes, simd::load(row_sum + v * simd::kLanes) + prob);
      }
    for (int m = 0; m < kRows; m += simd::kLanes)
      simd::store(sum + m, simd::load(sum + m) * simd::load(rescale + m) + simd::load(row_sum + m));
  }

  // Natural-log LSE of row m, and the factor that normalizes its output (0 if it saw no key).
  float lse(int m) const { return sum[m] > 0.0f ? max[m] + std::log(sum[m]) : kNegInf; }
  float normalizer(int m) const { return sum[m] > 0.0f ? 1.0f / sum[m] : 0.0f; }
};

// Backward: probabilities from the saved LSE, p = exp(s - lse) (lse = +inf for rows that see
// no key, so that their p is 0). s <= lse up to rounding; p is capped at 1 all the same.
template <int kRows>
inline void probabilities_from_lse(float* s, int keys, const float* lse) {
  for (int n = 0; n < keys; ++n)
    for (int m = 0; m < kRows; m += simd::kLanes) {
      float* x = s + std::int64_t(n) * kRows + m;
      const simd::Vec exponent = simd::min(simd::load(x) - simd::load(lse + m), simd::splat(0.0f));
      simd::store(x, simd::exp2(exponent * kLog2e));
    }
}

// Backward: dS = P * (dP - D) in place of dP (D = rowsum(dO * O) per query), times the
// soft-capping derivative 1 - tanh^2 when `tanh_scores` is given.
template <int kRows>
inline void score_gradients(const float* p, float* dp, int keys, const float* delta, const float* tanh_scores) {
  for (int n = 0; n < keys; ++n)
    for (int m = 0; m < kRows; m += simd::kLanes) {
      const std::int64_t i = std::int64_t(n) * kRows + m;
      simd::Vec ds = simd::load(p + i) * (simd::load(dp + i) - simd::load(delta + m));
      if (tanh_scores) {
        const simd::Vec t = simd::load(tanh_scores + i);
        ds *= 1.0f - t * t;
      }
      simd::store(dp + i, ds);
    }
}

}  // namespace flashattn::cpu
