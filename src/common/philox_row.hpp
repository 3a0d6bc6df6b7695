#pragma once
// Philox4x32 (common/philox.hpp) of counters that differ only in their last word: a lane's
// calls along a row of 16 x 32 blocks of dropout's stream (counter (offset + (b h) 32 + lane,
// its high word, i / 16, j / 32): only j / 32 varies). The rounds' work that does not depend on
// the last word is done once, in the constructor: all of round 0's products, one of the two in
// rounds 1 and 2, and their XORs with the round keys, which leaves 16 of the 20 32x32-bit
// products (and fewer XORs and key additions) per call: 10 of 14 at dropout's 7 rounds. The result
// is exactly philox4x32<kRounds>(seed, {x, y, z, w}); tests/test_dropout.cpp checks it.
//
// Derivation. A round maps (x, y, z, w) under keys (K0, K1) to
// (hi(M1 z) ^ y ^ K0, lo(M1 z), hi(M0 x) ^ w ^ K1, lo(M0 x)); round r's keys are
// (k0 + r W0, k1 + r W1). With x, y, z fixed and w varying:
//   after round 0: x1 = hi(M1 z) ^ y ^ K00 (fixed), y1 = lo(M1 z) (fixed),
//                  z1 = hi(M0 x) ^ K10 ^ w = e ^ w, w1 = lo(M0 x) (fixed);
//   after round 1: x2 = hi(M1 z1) ^ (y1 ^ K01) = hi(M1 z1) ^ f, y2 = lo(M1 z1),
//                  z2 = hi(M0 x1) ^ w1 ^ K11 (fixed), w2 = lo(M0 x1) (fixed);
//   after round 2: x3 = y2 ^ (hi(M1 z2) ^ K02) = y2 ^ g, y3 = lo(M1 z2) (fixed),
//                  z3 = hi(M0 x2) ^ (w2 ^ K12) = hi(M0 x2) ^ h, w3 = lo(M0 x2);
//   after round 3: x4 = hi(M1 z3) ^ (y3 ^ K03) = hi(M1 z3) ^ j, and the rest as any round.
#include <cstdint>

#include "common/philox.hpp"

namespace flashattn::detail {

// (lo, hi) of the 64-bit product a b: on the device one IMAD.WIDE.U32, which ptxas otherwise
// splits here into IMAD and IMAD.HI (two issue slots).
struct WideProduct {
  std::uint32_t lo, hi;
};
FA_HOST_DEVICE WideProduct mul_wide(std::uint32_t a, std::uint32_t b) {
#if defined(__CUDA_ARCH__)
  std::uint32_t lo, hi;
  asm("{\n\t.reg .u64 p;\n\tmul.wide.u32 p, %2, %3;\n\tmov.b64 {%0, %1}, p;\n\t}" : "=r"(lo), "=r"(hi) : "r"(a), "r"(b));
  return {lo, hi};
#else
  const std::uint64_t p = std::uint64_t(a) * b;
  return {std::uint32_t(p), std::uint32_t(p >> 32)};
#endif
}

template <int kRounds = kDropoutRounds>
struct PhiloxRow {
  static_assert(kRounds >= 4, "rounds 0-3 are unrolled by hand below");
  static constexpr std::uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  static constexpr std::uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;

  std::uint32_t k0, k1;     // the seed
  std::uint32_t e, f, g, h, j;  // the fixed parts, as in the derivation above

  FA_HOST_DEVICE PhiloxRow(std::uint64_t seed, std::uint32_t x, std::uint32_t y, std::uint32_t z)
      : k0(std::uint32_t(seed)), k1(std::uint32_t(seed >> 32)) {
    const std::uint32_t x1 = mulhi32(kM1, z) ^ y ^ k0, y1 = kM1 * z, w1 = kM0 * x;
    e = mulhi32(kM0, x) ^ k1;
    f = y1 ^ (k0 + kW0);
    const std::uint32_t z2 = mulhi32(kM0, x1) ^ w1 ^ (k1 + kW1), w2 = kM0 * x1;
    g = mulhi32(kM1, z2) ^ (k0 + 2 * kW0);
    h = w2 ^ (k1 + 2 * kW1);
    j = kM1 * z2 ^ (k0 + 3 * kW0);
  }

  // philox4x32<kRounds>(seed, {x, y, z, w}).
  FA_HOST_DEVICE PhiloxWords operator()(std::uint32_t w) const {
    const WideProduct p1 = mul_wide(kM1, e ^ w);
    const std::uint32_t x2 = p1.hi ^ f;
    const WideProduct p2 = mul_wide(kM0, x2);
    const std::uint32_t x3 = p1.lo ^ g, z3 = p2.hi ^ h;
    const WideProduct a = mul_wide(kM0, x3), b = mul_wide(kM1, z3);
    PhiloxWords c{b.hi ^ j, b.lo, a.hi ^ p2.lo ^ (k1 + 3 * kW1), a.lo};
    std::uint32_t r0 = k0 + 4 * kW0, r1 = k1 + 4 * kW1;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int round = 4; round < kRounds; ++round) {
      const WideProduct p0 = mul_wide(kM0, c.x), q1 = mul_wide(kM1, c.z);
      c = {q1.hi ^ c.y ^ r0, q1.lo, p0.hi ^ c.w ^ r1, p0.lo};
      r0 += kW0;
      r1 += kW1;
    }
    return c;
  }
};

// Dropout's keep test on the four bytes of a word at once (SWAR): kept_msbs(w) has bit 8 k + 7 set
// iff byte k of w is >= threshold (< 256), and no other bit. With H = 0x80808080 and t the
// threshold, D = (w | H) - (t mod 128 in every byte) never borrows across bytes, and D's byte k
// has its top bit set iff (byte k mod 128) >= t mod 128. Byte k >= t is then: for t < 128, that
// or byte k's own top bit (D | w); for t >= 128, that and byte k's own top bit (D & w). Both are
// the majority of (D, w, Y) with Y all ones or all zeros: two logic instructions and an add.
struct ByteKeepTest {
  static constexpr std::uint32_t kTopBits = 0x80808080u;
  std::uint32_t low;  // t mod 128 in every byte
  std::uint32_t any;  // t < 128: all ones (D | w); else 0 (D & w)

  FA_HOST_DEVICE explicit ByteKeepTest(std::uint32_t threshold)
      : low((threshold & 0x7fu) * 0x01010101u), any(threshold < 128u ? 0xffffffffu : 0u) {}

  FA_HOST_DEVICE std::uint32_t kept_msbs(std::uint32_t w) const {
    const std::uint32_t d = (w | kTopBits) - low;
    return ((d & w) | (d & any) | (w & any)) & kTopBits;
  }
};

}  // namespace flashattn::detail
