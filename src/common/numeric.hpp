#pragma once
// Host conversions between float and the 16-bit and 8-bit storage types (round to nearest even).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "common/host_device.hpp"

namespace flashattn::detail {

inline float bits_to_float(std::uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline std::uint32_t float_to_bits(float f) {
  std::uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

inline float bf16_to_float(std::uint16_t h) { return bits_to_float(std::uint32_t(h) << 16); }

inline std::uint16_t float_to_bf16(float f) {
  std::uint32_t bits = float_to_bits(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return std::uint16_t((bits >> 16) | 0x40);  // quiet NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return std::uint16_t(bits >> 16);
}

inline float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (man << 13));  // inf / NaN
  if (exp != 0) return bits_to_float(sign | ((exp + 112) << 23) | (man << 13));
  // Zero or subnormal: man * 2^-24, exact in float.
  const float value = float(man) * 5.9604644775390625e-8f;
  return sign ? -value : value;
}

inline std::uint16_t float_to_half(float f) {
  const std::uint32_t bits = float_to_bits(f);
  const std::uint16_t sign = std::uint16_t((bits >> 16) & 0x8000u);
  const std::uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {                        // below 2^-14: subnormal or zero
    // Scale so that the half subnormal unit (2^-24) becomes 1, then round to nearest even.
    const float scaled = bits_to_float(abs) * 16777216.0f;
    const float rounded = scaled + 12582912.0f - 12582912.0f;  // RNE to an integer (|x| < 2^22)
    return sign | std::uint16_t(rounded);
  }
  // Normal: rebias the exponent and round the mantissa from 23 to 10 bits.
  std::uint32_t h = ((abs >> 13) - (112u << 10));
  const std::uint32_t rest = abs & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return sign | std::uint16_t(h);
}

// e4m3 (OCP FP8 "E4M3FN", torch.float8_e4m3fn): 1 sign, 4 exponent (bias 7), 3 mantissa bits; no
// infinities, NaN 0x7f / 0xff, largest finite 448, subnormals k * 2^-9.
inline float e4m3_to_float(std::uint8_t x) {
  const int exp = (x >> 3) & 0xf, man = x & 7;
  if (exp == 15 && man == 7) return std::numeric_limits<float>::quiet_NaN();
  const float magnitude = exp == 0 ? std::ldexp(float(man), -9) : std::ldexp(1.0f + float(man) / 8.0f, exp - 7);
  return (x & 0x80) ? -magnitude : magnitude;
}

// Round to nearest even, saturating at +-448 (as the GPU's cvt.rn.satfinite); NaN -> 0x7f. Host
// and device (quantize_e4m3's kernels use it on every GPU, so that both backends give the same
// bits), by the float's bits.
FA_HOST_DEVICE std::uint8_t float_to_e4m3(float f) {
#ifdef __CUDA_ARCH__
  const std::uint32_t bits = __float_as_uint(f);
#else
  std::uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
#endif
  const std::uint8_t sign = std::uint8_t((bits >> 24) & 0x80u);
  const std::uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return 0x7f;             // NaN
  if (magnitude >= 0x43e00000u) return sign | 0x7e;     // >= 448: the largest finite
  if (magnitude < 0x3c800000u) {                        // below 2^-6: multiples of 2^-9
#ifdef __CUDA_ARCH__
    const float units = rintf(__uint_as_float(magnitude) * 512.0f);
#else
    float a;
    std::memcpy(&a, &magnitude, sizeof a);
    const float units = std::nearbyint(a * 512.0f);  // exact scaling; ties to even
#endif
    return sign | std::uint8_t(units);  // 8 units is the smallest normal, code 8
  }
  // Normal: the exponent rebiased (127 -> 7), 23 mantissa bits rounded to 3, ties to even; a
  // carry out of the mantissa moves into the exponent. Codes stay <= 0x7e (448 and above left).
  const std::uint32_t exponent = (magnitude >> 23) - 127 + 7, mantissa = magnitude & 0x7fffffu;
  const std::uint32_t rounded = (mantissa + 0x7ffffu + ((mantissa >> 20) & 1u)) >> 20;
  return sign | std::uint8_t((exponent << 3) + rounded);
}

}  // namespace flashattn::detail
