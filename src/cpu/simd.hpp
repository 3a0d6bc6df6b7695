#pragma once
// Float vectors for the CPU backend, as wide as the target allows, written with the GCC/Clang
// vector extension: the compiler picks the instructions (AVX-512, AVX2/FMA or SSE with
// -march=native) and keeps the micro-kernels' accumulators in registers. We use the extension
// rather than plain loops because GCC's auto-vectorizer prefers 256-bit vectors on AVX-512
// Xeons, which halves the multiply-add rate there.
#include <cstdint>
#include <cstring>
#include <utility>

namespace flashattn::cpu::simd {

#if defined(__AVX512F__)
inline constexpr int kBytes = 64;
#elif defined(__AVX__)
inline constexpr int kBytes = 32;
#else
inline constexpr int kBytes = 16;
#endif
inline constexpr int kLanes = kBytes / int(sizeof(float));

typedef float Vec __attribute__((vector_size(kBytes)));
typedef std::int32_t VecInt __attribute__((vector_size(kBytes)));

inline Vec load(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, Vec v) { std::memcpy(p, &v, sizeof v); }
// A broadcast, written as an initializer with x in every lane, which compiles to one
// vbroadcastss (Vec{} + x would cost an add, since -0 + 0 = +0).
inline Vec splat(float x) {
  return [x]<std::size_t... I>(std::index_sequence<I...>) { return Vec{(void(I), x)...}; }(
      std::make_index_sequence<kLanes>{});
}

inline VecInt splat_int(std::int32_t x) {
  return [x]<std::size_t... I>(std::index_sequence<I...>) { return VecInt{(void(I), x)...}; }(
      std::make_index_sequence<kLanes>{});
}

inline Vec min(Vec a, Vec b) { return a < b ? a : b; }
inline Vec max(Vec a, Vec b) { return a > b ? a : b; }

// 2^x to about 1 ulp, for x <= 127 (callers guarantee it: softmax arguments are <= 0).
// x = n + f with n an integer and |f| <= 1/2; 2^f from its Taylor series (degree 7, error
// below 1e-8); 2^n enters through the exponent bits. Adding 1.5 * 2^23 rounds x to an
// integer n whose two's complement lands in the low mantissa bits, so shifting those bits
// left by 23 gives n in the exponent field directly. Inputs below -126 give exactly 0
// (whatever the arithmetic made of them on the way, -inf included), which is how masked
// scores drop out of the softmax. NaN is not expected.
inline Vec exp2(Vec x) {
  const VecInt underflow = x < -126.0f;
  const Vec round_shift = splat(12582912.0f);  // 1.5 * 2^23
  const Vec shifted = x + round_shift;
  const Vec f = x - (shifted - round_shift);
  Vec p = splat(1.5252733804059840e-5f);
  p = p * f + 1.5403530393381606e-4f;
  p = p * f + 1.3333558146428443e-3f;
  p = p * f + 9.6181291076284772e-3f;
  p = p * f + 5.5504108664821580e-2f;
  p = p * f + 2.4022650695910071e-1f;
  p = p * f + 6.9314718055994531e-1f;
  p = p * f + 1.0f;
  VecInt bits, n_bits;
  std::memcpy(&bits, &p, sizeof bits);
  std::memcpy(&n_bits, &shifted, sizeof n_bits);
  bits += n_bits << 23;
  Vec r;
  std::memcpy(&r, &bits, sizeof r);
  return underflow ? splat(0.0f) : r;
}

// tanh(x) = sign(x) (1 - e) / (1 + e) with e = e^(-2|x|) in (0, 1]: exp2 only sees arguments
// <= 0, and large |x| saturate cleanly to +-1 (absolute error about 1e-7).
inline Vec tanh(Vec x) {
  constexpr float kMinusTwoLog2e = -2.8853900817779268f;  // -2 / ln 2
  const VecInt sign_bit = splat_int(std::int32_t(0x80000000u));
  VecInt bits;
  std::memcpy(&bits, &x, sizeof bits);
  const VecInt sign = bits & sign_bit;
  const VecInt abs_bits = bits & ~sign_bit;
  Vec abs_x;
  std::memcpy(&abs_x, &abs_bits, sizeof abs_x);
  const Vec e = exp2(abs_x * kMinusTwoLog2e);
  const Vec t = (1.0f - e) / (1.0f + e);
  VecInt t_bits;
  std::memcpy(&t_bits, &t, sizeof t_bits);
  t_bits |= sign;
  Vec r;
  std::memcpy(&r, &t_bits, sizeof r);
  return r;
}

}  // namespace flashattn::cpu::simd
