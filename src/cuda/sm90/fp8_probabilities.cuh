#pragma once
// The FP8 forward's P: the probabilities of a key block, in the fp32 accumulator of S, become
// the e4m3 A operand of O += P V in registers.
//
// The two fragments hold different keys, and no data moves between threads: V^T's keys are stored
// in the order the accumulator already has (fp8_value_transpose.cuh, transposed_value_key). Of each
// 32 keys (one k-step of an 8-bit wgmma), row r's accumulator gives the thread of quad lane u the
// column pairs {2u, 2u + 1} of the four groups of 8 (keys 2u + 8g, g = 0..3); the A operand
// (CuTe's GMMA ALayout_64x32) takes in its register for slots 4u .. 4u + 3 of the first 16 (and
// 16 + 4u .. 19 + 4u of the second) four bytes of this thread's own row. Packing the thread's
// pairs of groups (0, 1), then (2, 3), into one word each puts keys 2u, 2u + 1, 2u + 8, 2u + 9 (of
// each 16) in those slots, which is where V^T holds the same keys' values: the sum over keys of
// O += P V is the same in any order.
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
// operand: its ((4, 2, 2), 1, N/32) e4m3 A fragment, for V^T in transposed_value_key's order.
template <class Accumulator, class Operand>
CUTE_DEVICE void probabilities_to_e4m3_operand(Accumulator const& acc, Operand& operand) {
  using namespace cute;
  constexpr int kGroups = decltype(size<0, 2>(acc))::value;  // N / 8
  static_assert(decltype(size(acc))::value == 4 * kGroups && kGroups % 4 == 0, "a 64 x N accumulator, N % 32 == 0");
  static_assert(decltype(size(operand))::value == 4 * kGroups, "as many operand bytes as probabilities");
  std::uint32_t* words = reinterpret_cast<std::uint32_t*>(raw_pointer_cast(operand.data()));
#pragma unroll
  for (int s = 0; s < kGroups / 4; ++s) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {  // rows r and r + 8
#pragma unroll
      for (int k = 0; k < 2; ++k) {  // keys 0-15 and 16-31 of the 32
        const int g0 = 4 * s + 2 * k, g1 = g0 + 1;
        words[half + 2 * k + 4 * s] = pack_e4m3x2(acc(4 * g0 + 2 * half), acc(4 * g0 + 2 * half + 1)) |
                                      (pack_e4m3x2(acc(4 * g1 + 2 * half), acc(4 * g1 + 2 * half + 1)) << 16);
      }
    }
  }
}

// The e4m3 A fragment of a 64 x N P per thread: ((4 bytes, 2 row halves, 2 key halves), 1, N/32).
template <int kBlockN>
using ProbabilityOperandLayout = cute::Layout<cute::Shape<cute::Shape<cute::_4, cute::_2, cute::_2>, cute::_1,
                                                         cute::Int<kBlockN / 32>>>;

}  // namespace flashattn::cuda::sm90
