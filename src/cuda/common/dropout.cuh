#pragma once
// Dropout on a thread's share of a (query rows x keys) tile of P in registers, in the m16n8
// accumulator layout (mma.sync, and each warp of a wgmma accumulator), with the random stream
// of common/philox.hpp: one Philox call gives the 16 bytes of the lane's 16 elements of one
// 16 x 32 block, word w for its n8 tile w. Where a thread's n8 tiles are consecutive 8-column
// groups from an aligned 32-column boundary (every forward kernel, whose warps span all of a
// tile's keys) one call serves four tiles; otherwise (the sm80 backward's S = Q K^T with warps
// side by side along the keys, which interleave at 8 columns) each n8 tile makes its own call
// and uses a quarter of it.
//
// The keep factor is 1 or 0 here; the 1 / (1 - p) scale is applied where it costs least (the
// forward's output normalization, the backward's D-shifted dP and dV scale).
#include <cstdint>

#include <cute/tensor.hpp>

#include "common/philox.hpp"

namespace flashattn::cuda {

// The call's stream, resolved on the device (dropout.state read once per thread).
struct DropoutStream {
  std::uint64_t seed, offset;
  std::uint32_t threshold;
  int heads_q;

  static __device__ __forceinline__ DropoutStream load(const detail::DropoutParams& d, int heads_q) {
    DropoutStream s;
    if (d.state != nullptr) {
      s.seed = d.state[0];
      s.offset = d.state[1];
    } else {
      s.seed = d.seed;
      s.offset = d.offset;
    }
    s.threshold = d.threshold;
    s.heads_q = heads_q;
    return s;
  }

  // The same, read again where it is used: the state through a volatile load that the compiler
  // cannot hoist, the rest from the kernel parameters, so that a kernel short of registers (the
  // sm90 forward's consumers) holds none of it across its main loop.
  static __device__ __forceinline__ DropoutStream load_here(const detail::DropoutParams& d, int heads_q) {
    DropoutStream s;
    if (d.state != nullptr) {
      asm volatile("ld.global.v2.u64 {%0, %1}, [%2];\n" : "=l"(s.seed), "=l"(s.offset) : "l"(d.state));
    } else {
      s.seed = d.seed;
      s.offset = d.offset;
    }
    s.threshold = d.threshold;
    s.heads_q = heads_q;
    return s;
  }

  // The four words of the lane that holds element (i, j) of (b, h) (i, j from the sequence start).
  __device__ __forceinline__ detail::PhiloxWords words(int b, int h, int i, int j) const {
    return detail::dropout_philox(seed, detail::dropout_counter(offset, b, heads_q, h, detail::dropout_lane(i, j),
                                                                i >> 4, j >> 5));
  }

  // Whether byte k of `word` is kept.
  __device__ __forceinline__ bool keeps_byte(std::uint32_t word, int k) const {
    return detail::byte_of(word, k) >= threshold;
  }

  // Whether the value in 16-bit half `half` of `word` (a byte spread to 16 bits) is kept.
  __device__ __forceinline__ bool keeps(std::uint32_t word, int half) const {
    return (half ? word >> 16 : word & 0xffffu) >= threshold;
  }
};

// Calls f(k, m, n, keep) for every element (k, m, n) of a thread's fp32 accumulator
// (4, MMA_M, MMA_N) of an m16n8 tiled MMA. coords: the same partition of an identity tensor
// (tile-local (row, column)); row0/col0: the tile's first query row and key within the sequence.
// kConsecutiveTiles: the thread's n8 tiles 4t..4t+3 are the four n8 tiles of one 32-column block
// (the caller knows its layout, kDropoutConsecutiveTiles, and that col0 is a multiple of 32).
template <bool kConsecutiveTiles, int kM, int kN, class Coords, class F>
__device__ __forceinline__ void visit_dropout(const Coords& coords, const DropoutStream& rng, int b, int h, int row0,
                                              int col0, F&& f) {
  using namespace cute;
  static_assert(!kConsecutiveTiles || kN % 4 == 0, "a thread's n8 tiles in whole 32-column blocks");
  // Elements 0-3 of an n8 tile, (row a, col 2t), (a, 2t+1), (a+8, 2t), (a+8, 2t+1), are bytes
  // 0-3 of the tile's word. One compare a byte: ByteKeepTest's four at once spilled more in the
  // sm80 forward (ptxas, bf16, d = 128, 2026-11-27: 208 against 192 bytes of spill stores).
  auto visit_tile = [&](int m, int n, std::uint32_t word) {
    CUTE_UNROLL
    for (int k = 0; k < 4; ++k) f(k, m, n, rng.keeps_byte(word, k));
  };
  CUTE_UNROLL
  for (int m = 0; m < kM; ++m) {
    if constexpr (kConsecutiveTiles) {
      CUTE_UNROLL
      for (int n = 0; n < kN; n += 4) {
        const int i = row0 + get<0>(coords(0, m, n)), j = col0 + get<1>(coords(0, m, n));
        const detail::PhiloxWords r = rng.words(b, h, i, j);
        visit_tile(m, n, r.x);
        visit_tile(m, n + 1, r.y);
        visit_tile(m, n + 2, r.z);
        visit_tile(m, n + 3, r.w);
      }
    } else {
      CUTE_UNROLL
      for (int n = 0; n < kN; ++n) {
        const int i = row0 + get<0>(coords(0, m, n)), j = col0 + get<1>(coords(0, m, n));
        visit_tile(m, n, detail::word_of(rng.words(b, h, i, j), detail::dropout_word(j)));
      }
    }
  }
}

// Zeroes the dropped entries of `acc` (the sm80 forward's P before P V; its calls unrolled, which
// spilled less there than one call at a time: ptxas, bf16, d = 128, 2026-11-26, 40 against 76
// bytes of spill stores). The sm90 forward draws its keep bits apart from the softmax instead
// (sm90/forward_dropout.cuh).
template <bool kConsecutiveTiles, class Acc, class Coords>
__device__ __forceinline__ void apply_dropout(Acc& acc, const Coords& coords, const DropoutStream& rng, int b,
                                              int h, int row0, int col0) {
  using namespace cute;
  static_assert(decltype(size<0>(acc))::value == 4, "an m16n8 accumulator fragment");
  visit_dropout<kConsecutiveTiles, decltype(size<1>(acc))::value, decltype(size<2>(acc))::value>(
      coords, rng, b, h, row0, col0, [&](int k, int m, int n, bool keep) {
        if (!keep) acc(k, m, n) = 0.0f;
      });
}

// acc(k, m, n) *= keep ? keep_scale : 0 (the backward's dP where P z is not needed).
template <bool kConsecutiveTiles, class Acc, class Coords>
__device__ __forceinline__ void apply_dropout_scaled(Acc& acc, const Coords& coords, const DropoutStream& rng, int b,
                                                     int h, int row0, int col0, float keep_scale) {
  using namespace cute;
  static_assert(decltype(size<0>(acc))::value == 4, "an m16n8 accumulator fragment");
  visit_dropout<kConsecutiveTiles, decltype(size<1>(acc))::value, decltype(size<2>(acc))::value>(
      coords, rng, b, h, row0, col0, [&](int k, int m, int n, bool keep) {
        acc(k, m, n) = keep ? acc(k, m, n) * keep_scale : 0.0f;
      });
}

// The backward: dP becomes dP * z and, once dS is computed from it, P becomes P * z, with
// z = keep / (1 - p) (dS = P (dP z - D), dV += (P z)^T dO). The mask is drawn once, into bits.
template <int kElements>
struct DropoutBits {
  std::uint32_t bits[(kElements + 31) / 32];

  template <bool kConsecutiveTiles, class Acc, class Coords>
  __device__ __forceinline__ void draw(const Acc& acc, const Coords& coords, const DropoutStream& rng, int b, int h,
                                       int row0, int col0) {
    using namespace cute;
    CUTE_UNROLL
    for (int w = 0; w < (kElements + 31) / 32; ++w) bits[w] = 0;
    constexpr int kM = decltype(size<1>(acc))::value, kN = decltype(size<2>(acc))::value;
    visit_dropout<kConsecutiveTiles, kM, kN>(coords, rng, b, h, row0, col0, [&](int k, int m, int n, bool keep) {
      const int e = k + 4 * (m + kM * n);
      if (keep) bits[e / 32] |= 1u << (e % 32);
    });
  }

  // acc(k, m, n) *= keep ? scale : 0.
  template <class Acc>
  __device__ __forceinline__ void scale(Acc& acc, float keep_scale) const {
    using namespace cute;
    constexpr int kM = decltype(size<1>(acc))::value, kN = decltype(size<2>(acc))::value;
    CUTE_UNROLL
    for (int n = 0; n < kN; ++n)
      CUTE_UNROLL
      for (int m = 0; m < kM; ++m)
        CUTE_UNROLL
        for (int k = 0; k < 4; ++k) {
          const int e = k + 4 * (m + kM * n);
          acc(k, m, n) = (bits[e / 32] >> (e % 32)) & 1u ? acc(k, m, n) * keep_scale : 0.0f;
        }
  }
};

// The keep bits of a thread's share of a TRANSPOSED tile (keys x queries: S^T, as the sm90
// backward's wgmma accumulators hold it), in m16n8 tiles (4, 1, kG) of one warp's 16 keys: the
// warp draws the stream's words as the lanes of the untransposed tile would (lane = the
// hardware lane: a query-row-major m16n8 fragment; the warp's 16 keys are half of a 32-key block,
// so it uses two of each call's four words), spreads each 8 x 8 block's bytes to 16-bit values,
// and movmatrix transposes them in registers, so that every lane gets the values of the elements
// it holds. coords: the same view of an identity tensor ((key, query) within the tile);
// key0/row0: the tile's first key and query row in the sequence. Bit k + 4 * n of the result:
// element (k, 0, n).
__device__ __forceinline__ std::uint32_t movmatrix_transpose(std::uint32_t x) {
  std::uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// Bytes 2 rh and 2 rh + 1 of `word` (row half rh of an n8 tile's four elements) as the low and
// high 16-bit halves.
__device__ __forceinline__ std::uint32_t spread_row_half(std::uint32_t word, int rh) {
  return __byte_perm(word, 0u, rh ? 0x4342u : 0x4140u);
}

template <int kG, class Coords>
__device__ __forceinline__ std::uint32_t transposed_keep_bits(const Coords& coords, const DropoutStream& rng, int b,
                                                              int h, int key0, int row0) {
  using namespace cute;
  static_assert(kG % 2 == 0 && 4 * kG <= 32, "up to 8 n8 tiles of queries, in aligned pairs");
  const int lane = int(threadIdx.x % 32);
  std::uint32_t bits = 0;
  auto put = [&](int n, std::uint32_t top, std::uint32_t bottom) {
    bits |= std::uint32_t(rng.keeps(top, 0)) << (4 * n);
    bits |= std::uint32_t(rng.keeps(top, 1)) << (4 * n + 1);
    bits |= std::uint32_t(rng.keeps(bottom, 0)) << (4 * n + 2);
    bits |= std::uint32_t(rng.keeps(bottom, 1)) << (4 * n + 3);
  };
  // Tile n holds queries query0 + 8n (the tiles of a wgmma accumulator are consecutive); one call
  // per pair, not unrolled (one call's registers live at a time).
  const int key = key0 + get<0>(coords(0, 0, 0)), query0 = row0 + get<1>(coords(0, 0, 0));
  const bool upper_keys = ((key >> 4) & 1) != 0;  // the warp's 16 keys: words 2 and 3, else 0 and 1
#pragma unroll 1
  for (int n = 0; n < kG; n += 2) {
    const detail::PhiloxWords r = detail::dropout_philox(
        rng.seed, detail::dropout_counter(rng.offset, b, rng.heads_q, h, lane, (query0 + 8 * n) >> 4, key >> 5));
    // Word ch: the untransposed 16 x 8 tile of keys 8 ch.. of the warp's 16; its row half rh:
    // queries 8 rh... Tile n holds queries 8 * (n % 2).. (rh), keys a (ch 0, top) and a + 8 (ch 1,
    // bottom).
    const std::uint32_t left = upper_keys ? r.z : r.x, right = upper_keys ? r.w : r.y;
    put(n, movmatrix_transpose(spread_row_half(left, 0)), movmatrix_transpose(spread_row_half(right, 0)));
    put(n + 1, movmatrix_transpose(spread_row_half(left, 1)), movmatrix_transpose(spread_row_half(right, 1)));
  }
  return bits;
}

// acc(k, 0, n) *= keep ? keep_scale : 0 with the bits of transposed_keep_bits.
template <class Acc>
__device__ __forceinline__ void scale_by_keep_bits(Acc& acc, std::uint32_t bits, float keep_scale) {
  using namespace cute;
  constexpr int kG = decltype(size<2>(acc))::value;
  static_assert(decltype(size<1>(acc))::value == 1);
  CUTE_UNROLL
  for (int n = 0; n < kG; ++n)
    CUTE_UNROLL
    for (int k = 0; k < 4; ++k) acc(k, 0, n) = (bits >> (4 * n + k)) & 1u ? acc(k, 0, n) * keep_scale : 0.0f;
}

// Whether every thread's n8 tiles 4t..4t+3 of a (rows x cols) accumulator partition lie in one
// aligned 32-column block, for an m16n8 tiled MMA with WarpsN warps side by side along the
// columns: true iff WarpsN == 1 (a warp's tiles are then consecutive 8-column groups from
// column 0; the tile's column count must be a multiple of 32, which visit_dropout checks).
template <int WarpsN>
inline constexpr bool kDropoutConsecutiveTiles = WarpsN == 1;

}  // namespace flashattn::cuda
