#pragma once
// Host conversions between float and the 16-bit and 8-bit storage types (round to nearest even).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

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

// Round to nearest even, saturating at +-448 (as the GPU's cvt.rn.satfinite); NaN -> 0x7f.
inline std::uint8_t float_to_e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  const std::uint8_t sign = std::signbit(f) ? 0x80 : 0;
  const float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7e;
  if (a < 0x1p-6f)  // subnormal (or zero): multiples of 2^-9; 8 * 2^-9 is the smallest normal, code 8
    return sign | std::uint8_t(std::nearbyint(a * 512.0f));
  int e = 0;
  const float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  int exp = e - 1 + 7, man = int(std::nearbyint((m * 2.0f - 1.0f) * 8.0f));
  if (man == 8) {
    man = 0;
    ++exp;
  }
  const int code = (exp << 3) | man;
  return sign | std::uint8_t(code > 0x7e ? 0x7e : code);
}

}  // namespace flashattn::detail
