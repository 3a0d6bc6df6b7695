#pragma once
// Dropout's random stream, shared by every backend (host and device), so that the CPU backend,
// the float64 reference and both GPU kernel families drop exactly the same entries of P for
// the same (seed, offset), and the backward regenerates the forward's mask without storing it.
//
// The generator is Philox4x32 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
// SC 2011; with 10 rounds the generator of cuRAND and PyTorch): a 64-bit key (the seed) and a
// 128-bit counter give four 32-bit words.
//
// Which counter an element uses. Element (b, h, i, j) is query row i and key column j (counted
// from the start of sequence b, b the sequence of a varlen batch) of query head h. The score
// matrix of (b, h) is cut into blocks of 16 rows x 32 keys; within a block, row ri = i % 16 and
// column cj = j % 32 belong to "lane" t = (ri % 8) * 4 + (cj % 8) / 2, the lane that holds the
// element in the accumulator of m16n8 tensor-core tiles (mma.sync, and each warp of a wgmma).
// One Philox call serves one lane's 16 elements of one block:
//   key     = (seed low 32 bits, seed high 32 bits)
//   counter = (low and high 32 bits of offset + (b * heads_q + h) * 32 + t,  i / 16,  j / 32)
// and its 16 bytes go to the lane's elements in the accumulators' register order: word
// w = cj / 8 (the block's n8 tile), byte k = (ri / 8) * 2 + cj % 2 of it (little-endian), i.e. the
// four elements (ri, 2t'), (ri, 2t'+1), (ri + 8, 2t'), (ri + 8, 2t'+1) of n8 tile w. A kernel whose
// accumulator holds the transposed tile (keys x queries, the sm90 backward) computes the same
// words and transposes each 8 x 8 block of values in registers (movmatrix).
//
// The element is kept iff its byte is >= threshold = round(p * 256) (at most 255): the keep
// probability is (256 - threshold) / 256, p to within 2^-9, as flash-attn 2 draws it (one byte an
// element, 16 elements a call). Kept entries are scaled by 1 / (1 - p), as flash-attn does.
// The generator has 7 rounds (Philox4x32-7), flash-attn 2's choice too; Random123 publishes
// known-answer vectors for it (tests/test_dropout.cpp checks them).
//
// Why this layout: a lane of every forward kernel holds a 16-row slice of a tile across all its
// keys, so one call's 16 elements are all its own (16 x 32 blocks); the backward kernels, whose
// lanes hold 16-key slices, draw the call of the block that contains their slice and use half
// of it (the sm80 backward's warps with keys interleaved at 8 columns: a quarter). Until
// 2026-11-27 the stream was Philox4x32-10 with one call per 8 elements (16-bit values): the
// sm90 forward with dropout took 1.92-1.97x its time without at d = 128 (docs/log/sm90-forward.md).
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

// Philox4x32-R of `counter` under key `seed`: R rounds (10 is the generator's usual strength,
// dropout's stream uses kDropoutRounds).
template <int kRounds>
FA_HOST_DEVICE PhiloxWords philox4x32(std::uint64_t seed, PhiloxWords c) {
  constexpr std::uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr std::uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  std::uint32_t k0 = std::uint32_t(seed), k1 = std::uint32_t(seed >> 32);
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int round = 0; round < kRounds; ++round) {
    const std::uint32_t lo0 = kM0 * c.x, hi0 = mulhi32(kM0, c.x);
    const std::uint32_t lo1 = kM1 * c.z, hi1 = mulhi32(kM1, c.z);
    c = {hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0};
    k0 += kW0;
    k1 += kW1;
  }
  return c;
}

inline constexpr int kDropoutRounds = 7;

// The call of dropout's stream on `counter`.
FA_HOST_DEVICE PhiloxWords dropout_philox(std::uint64_t seed, PhiloxWords counter) {
  return philox4x32<kDropoutRounds>(seed, counter);
}

// The dropout of one call, normalized (problem.hpp holds one; p == 0: off).
struct DropoutParams {
  float p = 0.0f;                // probability of dropping an entry
  float keep_scale = 1.0f;       // 1 / (1 - p)
  std::uint32_t threshold = 0;   // keep iff the element's byte >= threshold
  std::uint64_t seed = 0;
  std::uint64_t offset = 0;
  // When set, seed = state[0] and offset = state[1] are read where the call runs (device
  // memory for CUDA tensors: CUDA-graph safe), and `seed`/`offset` are ignored.
  const std::uint64_t* state = nullptr;

  FA_HOST_DEVICE bool enabled() const { return p > 0.0f; }
};

// round(p * 256), at most 255.
inline std::uint32_t dropout_threshold(double p) {
  const double t = p * 256.0 + 0.5;
  return t >= 255.0 ? 255u : std::uint32_t(t);
}

// The Philox counter of the lane of (b, h) that holds elements of the 16 x 32 block
// (i16, j32), lane = (i % 8) * 4 + (j % 8) / 2 of any of its elements.
FA_HOST_DEVICE PhiloxWords dropout_counter(std::uint64_t offset, int b, int heads_q, int h, int lane,
                                           int i16, int j32) {
  const std::uint64_t linear = offset + (std::uint64_t(b) * std::uint64_t(heads_q) + std::uint64_t(h)) * 32u +
                               std::uint64_t(lane);
  return {std::uint32_t(linear), std::uint32_t(linear >> 32), std::uint32_t(i16), std::uint32_t(j32)};
}

FA_HOST_DEVICE int dropout_lane(int i, int j) { return (i & 7) * 4 + ((j & 7) >> 1); }

// Word of a call (0-3) and byte of the word (0-3) of element (i, j).
FA_HOST_DEVICE int dropout_word(int j) { return (j & 31) >> 3; }
FA_HOST_DEVICE int dropout_byte(int i, int j) { return ((i & 15) >> 3) * 2 + (j & 1); }

FA_HOST_DEVICE std::uint32_t word_of(const PhiloxWords& r, int w) {
  return w == 0 ? r.x : w == 1 ? r.y : w == 2 ? r.z : r.w;
}

// Byte k (0 low) of a word: an element's random value.
FA_HOST_DEVICE std::uint32_t byte_of(std::uint32_t word, int k) { return (word >> (8 * k)) & 0xffu; }

// The byte of one element (b, h, i, j): one whole Philox call, for the CPU and tests.
FA_HOST_DEVICE std::uint32_t dropout_value(std::uint64_t seed, std::uint64_t offset, int b, int heads_q, int h,
                                           int i, int j) {
  const PhiloxWords r =
      dropout_philox(seed, dropout_counter(offset, b, heads_q, h, dropout_lane(i, j), i >> 4, j >> 5));
  return byte_of(word_of(r, dropout_word(j)), dropout_byte(i, j));
}

FA_HOST_DEVICE bool dropout_keeps(const DropoutParams& d, std::uint64_t seed, std::uint64_t offset, int b,
                                  int heads_q, int h, int i, int j) {
  return dropout_value(seed, offset, b, heads_q, h, i, j) >= d.threshold;
}

}  // namespace flashattn::detail
