#pragma once
// Float vectors for the CPU backend, as wide as the target allows, written with the GCC/Clang
// vector extension: the compiler picks the instructions (AVX-512, AVX2/FMA or SSE with
// -march=native) and keeps the micro-kernels' accumulators in registers. We use the extension
// rather than plain loops because GCC's auto-vectorizer prefers 256-bit vectors on AVX-512
// Xeons, which halves the multiply-add rate there.
#include <cstdint>
#include <cstring>

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
inline Vec splat(float x) { return Vec{} + x; }

inline float reduce_max(Vec v) {
  float m = v[0];
  for (int i = 1; i < kLanes; ++i) m = v[i] > m ? v[i] : m;
  return m;
}

// 2^x to about 1 ulp. x = n + f with n an integer and |f| <= 1/2; 2^f from its Taylor series
// (degree 7, error below 1e-8), 2^n added to the exponent bits. Inputs below -126 give
// exactly 0, which is how masked scores (-inf) drop out of the softmax; NaN is not expected.
inline Vec exp2(Vec x) {
  const VecInt underflow = x < -126.0f;
  x = x < -126.0f ? splat(-126.0f) : x;
  x = x > 127.0f ? splat(127.0f) : x;
  const Vec round_shift = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  const Vec n = (x + round_shift) - round_shift;
  const Vec f = x - n;
  Vec p = splat(1.5252733804059840e-5f);
  p = p * f + 1.5403530393381606e-4f;
  p = p * f + 1.3333558146428443e-3f;
  p = p * f + 9.6181291076284772e-3f;
  p = p * f + 5.5504108664821580e-2f;
  p = p * f + 2.4022650695910071e-1f;
  p = p * f + 6.9314718055994531e-1f;
  p = p * f + 1.0f;
  VecInt bits;
  std::memcpy(&bits, &p, sizeof bits);
  bits += __builtin_convertvector(n, VecInt) << 23;
  Vec r;
  std::memcpy(&r, &bits, sizeof r);
  return underflow ? splat(0.0f) : r;
}

// tanh(x) = 1 - 2 / (1 + e^(2x)); saturates cleanly to +-1 (absolute error about 1e-7).
inline Vec tanh(Vec x) {
  constexpr float kTwoLog2e = 2.8853900817779268f;  // 2 / ln 2
  return 1.0f - 2.0f / (1.0f + exp2(x * kTwoLog2e));
}

}  // namespace flashattn::cpu::simd
