#pragma once
// Dropout in the sm90 forward's consumers, in two steps around a key block's softmax:
//  - draw: the keep bits of the thread's share of the block (64 rows x kBlockN keys per
//    warpgroup: kBlockN / 2 elements, at most 64, two registers), right after the block's
//    S = Q K^T is issued, while the warpgroup would otherwise only wait for it: the bits depend
//    on coordinates alone, not on S;
//  - zero_dropped: after the softmax step, one select per element.
// The random stream is common/philox.hpp's: one Philox call per 16 x 32 block gives the lane's
// 16 bytes, word q for the block's n8 tile q, so the same entries are dropped as by every other
// backend.
//
// Why: drawn between the softmax step and P = bf16(S) (2026-11-26, H100, d = 128, n = 4k), the
// Philox calls lay on the warpgroup's chain (S done -> softmax -> P -> next turn's P.V), which
// sets the kernel's period: the forward took 2.37x its time without dropout.
#include <cstdint>

#include <cute/tensor.hpp>

#include "common/philox.hpp"
#include "common/philox_row.hpp"
#include "cuda/common/dropout.cuh"

namespace flashattn::cuda::sm90 {

// A block's keep bits: element (k, 0, n) of the thread's S fragment seen as m16n8 tiles
// (gmma_as_m16n8: (4, 1, kBlockN / 8)) is bit 8 k + n % 8 of 32-bit half n / 8. That order costs
// one shift and one masked OR per word of a call (each word's keep tests come out as the top bits
// of its four bytes, common/philox_row.hpp's ByteKeepTest).
CUTE_DEVICE constexpr int keep_bit(int k, int n) { return 32 * (n / 8) + 8 * k + n % 8; }

// The keep bits of one key block (keep_bit's order); coords: the same view of an identity tensor
// over the tile (row, key); row0: the tile's first query row, key0 the block's first key (in the
// sequence); batch_head: b * heads_q + h (the stream's counter, passed as batch with heads_q 1
// and head 0).
//
// The lane's calls cover 32-key windows of the sequence. A block whose width is not a multiple of
// 32 (112 keys at d = 192, 80 at d = 256) starts every other time 16 keys into a window: the
// windows then start 16 keys earlier, and the bits move down by two tiles at the end.
//
// The stream's parameters are read here (DropoutStream::load_here) rather than held across the
// mainloop, and the calls run two at a time in a loop that is not unrolled: the consumers have few
// registers to spare while S, O, P (and Q up to d = 128) are live.
template <class Coords>
CUTE_DEVICE std::uint64_t draw_keep_bits(const detail::DropoutParams& d, const Coords& coords, int batch_head,
                                         int row0, int key0) {
  using namespace cute;
  static_assert(decltype(size<1>(coords))::value == 1, "one 16-row slice per thread: a warpgroup's 64 rows");
  constexpr int kN = decltype(size<2>(coords))::value;  // n8 tiles of the block
  static_assert(kN % 2 == 0, "blocks of whole 16-key steps");
  constexpr bool kMayStartMidWindow = kN % 4 != 0;
  constexpr int kWindows = (kN + (kMayStartMidWindow ? 2 : 0) + 3) / 4;
  static_assert(kWindows <= 4, "64 bits: at most 16 n8 tiles of windows");
  const DropoutStream rng = DropoutStream::load_here(d, 1);
  const detail::ByteKeepTest test(rng.threshold);
  const int i = row0 + get<0>(coords(0, 0, 0)), key = key0 + get<1>(coords(0, 0, 0));
  const int first_window = key0 >> 5;
  // One lane's calls along its row of 16 x 32 blocks: the counter's first three words are
  // fixed, so the rounds' work that does not depend on the fourth (j / 32) is done once
  // (common/philox_row.hpp).
  const detail::PhiloxWords counter =
      detail::dropout_counter(rng.offset, batch_head, 1, 0, detail::dropout_lane(i, key), i >> 4, 0);
  const detail::PhiloxRow<> philox(rng.seed, counter.x, counter.y, counter.z);
  // Window c's 16 bits at keep_bit's places within its 32-bit half (window tiles 4 (c % 2) + q).
  auto draw_window = [&](int c) {
    const detail::PhiloxWords r = philox(std::uint32_t(first_window + c));
    const std::uint32_t words[4] = {r.x, r.y, r.z, r.w};
    std::uint32_t bits = 0;
    CUTE_UNROLL
    for (int q = 0; q < 4; ++q) {
      const int down = 7 - (4 * (c & 1) + q);  // bit 8 k + 7 -> 8 k + tile % 8
      bits |= (test.kept_msbs(words[q]) >> down) & (detail::ByteKeepTest::kTopBits >> down);
    }
    return bits;
  };
  std::uint64_t bits = 0;
  constexpr int kInFlight = 2;  // windows 2w and 2w + 1: one 32-bit half of the mask
  constexpr int kRolled = kWindows / kInFlight * kInFlight;
#pragma unroll 1
  for (int c = 0; c < kRolled; c += kInFlight) {
    std::uint32_t half = 0;
    CUTE_UNROLL
    for (int u = 0; u < kInFlight; ++u) half |= draw_window(c + u);
    bits |= std::uint64_t(half) << (32 * (c >> 1));
  }
  CUTE_UNROLL
  for (int c = kRolled; c < kWindows; ++c) bits |= std::uint64_t(draw_window(c)) << (32 * (c >> 1));
  if constexpr (kMayStartMidWindow) {
    if (key0 & 16) {  // tile n is window tile n + 2: in every byte, bits down by two
      const std::uint32_t lo = std::uint32_t(bits), hi = std::uint32_t(bits >> 32);
      const std::uint32_t new_lo = ((lo >> 2) & 0x3f3f3f3fu) | ((hi << 6) & 0xc0c0c0c0u);
      const std::uint32_t new_hi = (hi >> 2) & 0x3f3f3f3fu;
      bits = (std::uint64_t(new_hi) << 32) | new_lo;
    }
  }
  return bits;
}

// Zeroes the dropped entries of acc (the m16n8 view of the thread's S fragment, (4, 1, kN)).
template <class Acc>
CUTE_DEVICE void zero_dropped(Acc& acc, std::uint64_t bits) {
  using namespace cute;
  static_assert(decltype(size<0>(acc))::value == 4 && decltype(size<1>(acc))::value == 1);
  constexpr int kN = decltype(size<2>(acc))::value;
  // In the bits' order (consecutive bits: runs of R2P predicates).
  CUTE_UNROLL
  for (int half = 0; half < (kN + 7) / 8; ++half)
    CUTE_UNROLL
    for (int k = 0; k < 4; ++k)
      CUTE_UNROLL
      for (int n = 8 * half; n < 8 * half + 8 && n < kN; ++n)
        if (!((bits >> keep_bit(k, n)) & 1u)) acc(k, 0, n) = 0.0f;
}

}  // namespace flashattn::cuda::sm90
