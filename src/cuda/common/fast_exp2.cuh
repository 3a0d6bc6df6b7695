#pragma once
// exp2 for softmax probabilities, two ways:
//  - exp2_sfu: one MUFU.EX2 on the special-function unit (16 per clock per SM on Hopper);
//  - exp2_poly: FlashAttention-4's emulation on the FMA pipe, 2^x = 2^round(x) * 2^f with
//    f in [-0.5, 0.5] and 2^f from a cubic, for spreading a tile's exponentials over both units.
// Inputs are x <= ~0 (scores minus their running max, in log2 units) or -inf; both return
// exactly 0 for -inf (masked keys must contribute nothing).
#include <cute/config.hpp>

namespace flashattn::cuda {

CUTE_DEVICE float exp2_sfu(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Relative error below 7.5e-5 (a bf16 ulp is 3.9e-3 and an fp16 ulp 9.8e-4 relative to 1): the
// cubic is the minimax (Remez) fit of 2^f on [-0.5, 0.5] for relative error.
CUTE_DEVICE float exp2_poly(float x) {
  constexpr float kRound = 12582912.f;  // 1.5 * 2^23: x + kRound rounds x to an integer
  const float xc = fmaxf(x, -126.f);
  const float shifted = xc + kRound;
  const float f = xc - (shifted - kRound);  // in [-0.5, 0.5]
  float p = fmaf(0.05517166853f, f, 0.2426111251f);
  p = fmaf(p, f, 0.6932609677f);
  p = fmaf(p, f, 0.9999280572f);
  // The integer part sits in the low mantissa bits of `shifted`; move it into the exponent.
  const unsigned bits = __float_as_uint(p) + (__float_as_uint(shifted) << 23);
  return x < -126.f ? 0.f : __uint_as_float(bits);
}

}  // namespace flashattn::cuda
