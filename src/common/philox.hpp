#pragma once
// Dropout's random stream, shared by every backend (host and device), so that the CPU backend,
// the float64 reference and both GPU kernel families drop exactly the same entries of P for
// the same (seed, offset), and the backward regenerates the forward's mask without storing it.
//
// The generator is Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
// 3", SC 2011; the generator of cuRAND and PyTorch): a 64-bit key (the seed) and a 128-bit
// counter give four 32-bit words, 10 rounds.
//
// Which counter an element uses. Element (b, h, i, j) is query row i and key column j (counted
// from the start of sequence b, b the sequence of a varlen batch) of query head h. The score
// matrix of (b, h) is cut into 16 x 16 blocks; within a block, row ri = i % 16 and column
// cj = j % 16 belong to "lane" t = (ri % 8) * 4 + (cj % 8) / 2, the lane that holds the element
// in the accumulator of an m16n8 tensor-core tile (mma.sync, and each warp of a wgmma). One
// Philox call serves one lane's 8 elements of one block:
//   key     = (seed low 32 bits, seed high 32 bits)
//   counter = (low and high 32 bits of offset + (b * heads_q + h) * 32 + t,  i / 16,  j / 16)
// and its 8 16-bit halves (word w, low half first) go to the lane's elements in the
// accumulator's register order: value v = (cj / 8) * 4 + (ri / 8) * 2 + (cj % 2), i.e. word
// (cj / 8) * 2 + ri / 8, low half for even columns. A kernel whose accumulator holds the
// transposed tile (keys x queries, the sm90 backward) computes the same words and transposes
// each 8 x 8 block of 16-bit values in registers (movmatrix).
//
// The element is kept iff its 16-bit value is >= threshold = round(p * 65536) (at most 65535):
// the keep probability is (65536 - threshold) / 65536, p to within 2^-17. Kept entries are
// scaled by 1 / (1 - p), as flash-attn does. One Philox call per 8 elements: a 16 x 16 block is
// the largest one that every kernel's lanes hold whole (the sm80 backward's warps own 16-key
// slices, the sm90 backward's 16-key slices of the transposed tile), and 16-bit thresholds use
// all 128 bits of the call (flash-attn, with 16 elements a call, uses 8-bit thresholds).
// A caller that advances the offset by batch * heads_q * 32 per call never reuses a counter.
#include <cstdint>

#include "common/host_device.hpp"

namespace flashattn::detail {

struct PhiloxWords {
  std::uint32_t x, y, z, w;
};

FA_HOST_DEVICE std::uint32_t mulhi32(std::uint32_t a, std::uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __umulhi(a, b);
#else
  return std::uint32_t((std::uint64_t(a) * b) >> 32);
#endif
}

// Philox4x32-10 of `counter` under key `seed`.
FA_HOST_DEVICE PhiloxWords philox4x32_10(std::uint64_t seed, PhiloxWords c) {
  constexpr std::uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr std::uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  std::uint32_t k0 = std::uint32_t(seed), k1 = std::uint32_t(seed >> 32);
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) {
    const std::uint32_t lo0 = kM0 * c.x, hi0 = mulhi32(kM0, c.x);
    const std::uint32_t lo1 = kM1 * c.z, hi1 = mulhi32(kM1, c.z);
    c = {hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0};
    k0 += kW0;
    k1 += kW1;
  }
  return c;
}

// The dropout of one call, normalized (problem.hpp holds one; p == 0: off).
struct DropoutParams {
  float p = 0.0f;                // probability of dropping an entry
  float keep_scale = 1.0f;       // 1 / (1 - p)
  std::uint32_t threshold = 0;   // keep iff the element's 16-bit value >= threshold
  std::uint64_t seed = 0;
  std::uint64_t offset = 0;
  // When set, seed = state[0] and offset = state[1] are read where the call runs (device
  // memory for CUDA tensors: CUDA-graph safe), and `seed`/`offset` are ignored.
  const std::uint64_t* state = nullptr;

  FA_HOST_DEVICE bool enabled() const { return p > 0.0f; }
};

// round(p * 65536), at most 65535.
inline std::uint32_t dropout_threshold(double p) {
  const double t = p * 65536.0 + 0.5;
  return t >= 65535.0 ? 65535u : std::uint32_t(t);
}

// The Philox counter of the lane of (b, h) that holds elements of the 16 x 16 block
// (i16, j16), lane = (i % 8) * 4 + (j % 8) / 2 of any of its elements.
FA_HOST_DEVICE PhiloxWords dropout_counter(std::uint64_t offset, int b, int heads_q, int h, int lane,
                                           int i16, int j16) {
  const std::uint64_t linear = offset + (std::uint64_t(b) * std::uint64_t(heads_q) + std::uint64_t(h)) * 32u +
                               std::uint64_t(lane);
  return {std::uint32_t(linear), std::uint32_t(linear >> 32), std::uint32_t(i16), std::uint32_t(j16)};
}

FA_HOST_DEVICE int dropout_lane(int i, int j) { return (i & 7) * 4 + ((j & 7) >> 1); }

// Word of a call (0-3) and half (0 low, 1 high) of element (i, j).
FA_HOST_DEVICE int dropout_word(int i, int j) { return ((j & 15) >> 3) * 2 + ((i & 15) >> 3); }
FA_HOST_DEVICE int dropout_half(int j) { return j & 1; }

// The 16-bit value of one element (b, h, i, j): one whole Philox call, for the CPU and tests.
FA_HOST_DEVICE std::uint32_t dropout_value(std::uint64_t seed, std::uint64_t offset, int b, int heads_q, int h,
                                           int i, int j) {
  const PhiloxWords r =
      philox4x32_10(seed, dropout_counter(offset, b, heads_q, h, dropout_lane(i, j), i >> 4, j >> 4));
  const int word = dropout_word(i, j);
  const std::uint32_t bits = word == 0 ? r.x : word == 1 ? r.y : word == 2 ? r.z : r.w;
  return dropout_half(j) ? bits >> 16 : bits & 0xffffu;
}

FA_HOST_DEVICE bool dropout_keeps(const DropoutParams& d, std::uint64_t seed, std::uint64_t offset, int b,
                                  int heads_q, int h, int i, int j) {
  return dropout_value(seed, offset, b, heads_q, h, i, j) >= d.threshold;
}

}  // namespace flashattn::detail
