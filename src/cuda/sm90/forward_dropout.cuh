#pragma once
// Dropout in the sm90 forward's consumers, in two steps around a key block's softmax:
//  - draw: the keep bits of the thread's share of the block (64 rows x kBlockN keys per
//    warpgroup: kBlockN / 2 elements, at most 64, two registers), right after the block's
//    S = Q K^T is issued, while the warpgroup would otherwise only wait for it: the bits depend
//    on coordinates alone, not on S;
//  - zero_dropped: after the softmax step, one select per element.
// The random stream is common/philox.hpp's, drawn as common/dropout.cuh's visit_dropout does for
// paired n8 tiles (one Philox4x32-10 call per 16 x 16 block, its 8 16-bit values in the lane's
// register order), so the same entries are dropped as by every other backend.
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

// The keep bits of one key block: bit k + 4 n for element (k, 0, n) of the thread's S fragment
// seen as m16n8 tiles (gmma_as_m16n8: (4, 1, kBlockN / 8)); coords: the same view of an identity
// tensor over the tile (row, key); row0: the tile's first query row, key0 the block's first key
// (in the sequence); batch_head: b * heads_q + h (the stream's counter, passed as batch with
// heads_q 1 and head 0).
//
// The stream's parameters are read here (DropoutStream::load_here) rather than held across the
// mainloop, and the calls run kInFlight at a time in a loop that is not unrolled: the consumers
// have few registers to spare while S, O, P (and Q up to d = 128) are live.
template <int kInFlight = 2, class Coords>
CUTE_DEVICE std::uint64_t draw_keep_bits(const detail::DropoutParams& d, const Coords& coords, int batch_head,
                                         int row0, int key0) {
  using namespace cute;
  static_assert(decltype(size<1>(coords))::value == 1, "one 16-row slice per thread: a warpgroup's 64 rows");
  constexpr int kN = decltype(size<2>(coords))::value;  // n8 tiles of the block
  static_assert(kN % 2 == 0 && kN <= 16, "n8 tiles in aligned pairs (a wgmma spans the block), 64 bits");
  constexpr int kPairs = kN / 2;
  const DropoutStream rng = DropoutStream::load_here(d, 1);
  // Tile n holds keys key + 8 n (a wgmma accumulator's n8 tiles are consecutive): pair q is the
  // 16 x 16 block of keys key + 16 q.
  const int i = row0 + get<0>(coords(0, 0, 0)), key = key0 + get<1>(coords(0, 0, 0));
  // One lane's calls along its row of 16 x 16 blocks: the counter's first three words are
  // fixed, so the rounds' work that does not depend on the fourth (j / 16) is done once
  // (common/philox_row.hpp).
  const detail::PhiloxWords counter =
      detail::dropout_counter(rng.offset, batch_head, 1, 0, detail::dropout_lane(i, key), i >> 4, 0);
  const detail::PhiloxRow philox(rng.seed, counter.x, counter.y, counter.z);
  auto draw_byte = [&](int pair) {
    return detail::keep_byte(philox(std::uint32_t((key >> 4) + pair)), rng.threshold);
  };
  std::uint64_t bits = 0;
  constexpr int kRolledPairs = kPairs / kInFlight * kInFlight;
#pragma unroll 1
  for (int pair = 0; pair < kRolledPairs; pair += kInFlight) {
    std::uint32_t bytes = 0;
    CUTE_UNROLL
    for (int u = 0; u < kInFlight; ++u) bytes |= draw_byte(pair + u) << (8 * u);
    bits |= std::uint64_t(bytes) << (8 * pair);
  }
  CUTE_UNROLL
  for (int pair = kRolledPairs; pair < kPairs; ++pair) bits |= std::uint64_t(draw_byte(pair)) << (8 * pair);
  return bits;
}

// Zeroes the dropped entries of acc (the m16n8 view of the thread's S fragment, (4, 1, kN)).
template <class Acc>
CUTE_DEVICE void zero_dropped(Acc& acc, std::uint64_t bits) {
  using namespace cute;
  static_assert(decltype(size<0>(acc))::value == 4 && decltype(size<1>(acc))::value == 1);
  constexpr int kN = decltype(size<2>(acc))::value;
  CUTE_UNROLL
  for (int n = 0; n < kN; ++n)
    CUTE_UNROLL
    for (int k = 0; k < 4; ++k)
      if (!((bits >> (4 * n + k)) & 1u)) acc(k, 0, n) = 0.0f;
}

}  // namespace flashattn::cuda::sm90
