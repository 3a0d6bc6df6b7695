#pragma once
// The FP8 forward's P: the probabilities of a key block, in the fp32 accumulator of S, become
// the e4m3 A operand of O += P V in registers.
//
// The two fragments hold different columns. Of each 32 keys (one k-step of an 8-bit wgmma), row
// r's accumulator gives the thread of quad lane u the column pairs {2u, 2u + 1} of the four
// groups of 8 (keys 2u + 8g, g = 0..3), while the A operand wants keys 4u .. 4u + 3 in one
// register and 16 + 4u .. 19 + 4u in another (CuTe's GMMA ALayout_64x32). The keys 4u .. 4u + 3
// are the pairs 2u and 2u + 1 of the first 16, which quad lanes 2u mod 4 and 2u + 1 mod 4 hold
// (in their first group for u < 2, in their second for u >= 2): each thread packs its pairs of
// groups (0, 1) and (2, 3) into one 32-bit word each, and two shuffles within the quad and one
// byte permute build each register of the operand.
#include <cstdint>

#include <cute/tensor.hpp>

namespace flashattn::cuda::sm90 {

// Two floats -> two e4m3 (round to nearest, saturated to +-448): `first` in the low byte.
CUTE_DEVICE std::uint32_t pack_e4m3x2(float first, float second) {
  std::uint16_t packed;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(packed) : "f"(second), "f"(first));
  return packed;
}

// acc: this thread's ((2, 2, N/8), 1, 1) fp32 accumulator of a 64 x N tile (probabilities);
// operand: its ((4, 2, 2), 1, N/32) e4m3 A fragment. Every lane of the warp must call it.
template <class Accumulator, class Operand>
CUTE_DEVICE void probabilities_to_e4m3_operand(Accumulator const& acc, Operand& operand) {
  using namespace cute;
  constexpr int kGroups = decltype(size<0, 2>(acc))::value;  // N / 8
  static_assert(decltype(size(acc))::value == 4 * kGroups && kGroups % 4 == 0, "a 64 x N accumulator, N % 32 == 0");
  static_assert(decltype(size(operand))::value == 4 * kGroups, "as many operand bytes as probabilities");
  std::uint32_t* words = reinterpret_cast<std::uint32_t*>(raw_pointer_cast(operand.data()));
  const int lane = int(threadIdx.x % 32), u = lane % 4, quad = lane - u;
  const int source_a = quad + (2 * u) % 4, source_b = quad + (2 * u + 1) % 4;
  const std::uint32_t select = u < 2 ? 0x5410u : 0x7632u;  // low or high halves of both
#pragma unroll
  for (int s = 0; s < kGroups / 4; ++s) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {  // rows r and r + 8
#pragma unroll
      for (int k = 0; k < 2; ++k) {  // keys 0-15 and 16-31 of the 32
        const int g0 = 4 * s + 2 * k, g1 = g0 + 1;
        const std::uint32_t mine = pack_e4m3x2(acc(4 * g0 + 2 * half), acc(4 * g0 + 2 * half + 1)) |
                                   (pack_e4m3x2(acc(4 * g1 + 2 * half), acc(4 * g1 + 2 * half + 1)) << 16);
        const std::uint32_t a = __shfl_sync(0xffffffffu, mine, source_a);
        const std::uint32_t b = __shfl_sync(0xffffffffu, mine, source_b);
        words[half + 2 * k + 4 * s] = __byte_perm(a, b, select);
      }
    }
  }
}

// The e4m3 A fragment of a 64 x N P per thread: ((4 bytes, 2 row halves, 2 key halves), 1, N/32).
template <int kBlockN>
using ProbabilityOperandLayout = cute::Layout<cute::Shape<cute::Shape<cute::_4, cute::_2, cute::_2>, cute::_1,
                                                         cute::Int<kBlockN / 32>>>;

}  // namespace flashattn::cuda::sm90
