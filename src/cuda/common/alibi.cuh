#pragma once
// Device side of the ALiBi score policy (common/alibi.hpp): the bias on a thread's share of a
// score tile, for every kernel family. The hooks are one call each where the kernels turn raw
// products into scores (sm80: forward_kernel.cuh, backward_scores.cuh; sm90:
// forward_consumer.cuh, backward_consumer.cuh). The forwards take a uniform runtime branch once
// per tile, outside the element loop; the backwards, whose registers are full, have ALiBi as a
// template flag of their kernels (a second instance of each main kernel). A tile without ALiBi
// runs no ALiBi instruction.
//
// ALiBi never masks: the tiles a kernel visits and which of them need element-wise masking are
// the mask's business alone (mask_tiles.cuh), and masked scores stay -inf whatever is added.
#include <cute/tensor.hpp>

#include "common/alibi.hpp"

namespace flashattn::cuda {

// Adds -slope(r) * |diag(r) - key_of(r, c)| to scores(r, c), in the tile's units (slope(r): the
// bias per unit distance divided by the factor that turns the tile's values into scores).
// scores: (rows, cols) per thread; diag(r): i + seqlen_k - seqlen_q of the thread's row r.
// A thread's keys along a row lie at fixed offsets from its first one, so the distances are
// one float subtraction each from a per-row base.
template <class Scores, class Diag, class KeyOf, class Slope>
CUTE_DEVICE void add_alibi(Scores& scores, Diag diag, KeyOf key_of, Slope slope) {
  using namespace cute;
  CUTE_UNROLL
  for (int r = 0; r < size<0>(scores); ++r) {
    const float minus_slope = -slope(r);
    const int key_r = key_of(r, 0);
    const float base = float(diag(r) - key_r);
    CUTE_UNROLL
    for (int c = 0; c < size<1>(scores); ++c) {
      const float distance = fabsf(base - float(key_of(r, c) - key_r));
      scores(r, c) = fmaf(minus_slope, distance, scores(r, c));
    }
  }
}

// The backward's form: the bias of element (r, key) in base-2 units, added where P is
// recomputed as exp2(score * log2(e) - LSE * log2(e)). All rows of a backward tile belong to one
// query head, so one slope serves them.
template <int kRows>
struct AlibiRowsLog2 {
  static constexpr bool kEnabled = true;
  float minus_slope_log2;  // -slope * log2(e)
  int diag[kRows];         // i + seqlen_k - seqlen_q of the thread's rows

  CUTE_DEVICE float operator()(int r, int key) const {
    return minus_slope_log2 * fabsf(float(diag[r] - key));
  }
};

// A bias given as a function of (r, c) of a thread's share of a tile.
template <class F>
struct ScoreBias {
  static constexpr bool kEnabled = true;
  F f;
  CUTE_DEVICE float operator()(int r, int c) const { return f(r, c); }
};
template <class F>
CUTE_DEVICE ScoreBias<F> score_bias(F f) {
  return {f};
}

// No bias (the default of the backward's element-wise step).
struct NoScoreBias {
  static constexpr bool kEnabled = false;
  CUTE_DEVICE float operator()(int, int) const { return 0.0f; }
};

}  // namespace flashattn::cuda
