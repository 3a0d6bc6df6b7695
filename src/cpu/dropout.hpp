#pragma once
// Dropout on the CPU: the random stream of common/philox.hpp, a 16 x 32 block of the score
// matrix at a time (32 Philox calls give its 512 bytes), written as keep factors
// (1 / (1 - p) or 0) into the fast path's transposed score tiles.
#include <algorithm>
#include <cstdint>

#include "common/philox.hpp"
#include "common/problem.hpp"

namespace flashattn::cpu {

// The call's dropout with its (seed, offset) resolved (read from dropout.state when given).
struct DropoutStream {
  std::uint64_t seed = 0, offset = 0;
  std::uint32_t threshold = 0;
  float keep_scale = 1.0f;
  int heads_q = 0;
  bool enabled = false;

  explicit DropoutStream(const detail::Problem& p)
      : seed(p.dropout.state ? p.dropout.state[0] : p.dropout.seed),
        offset(p.dropout.state ? p.dropout.state[1] : p.dropout.offset),
        threshold(p.dropout.threshold),
        keep_scale(p.dropout.keep_scale),
        heads_q(p.heads_q),
        enabled(p.dropout.enabled()) {}

  // values[ri][cj]: the bytes of block (i16, j32) of the score matrix of (b, h).
  void block(int b, int h, int i16, int j32, std::uint8_t (&values)[16][32]) const {
    for (int lane = 0; lane < 32; ++lane) {
      const detail::PhiloxWords r =
          detail::dropout_philox(seed, detail::dropout_counter(offset, b, heads_q, h, lane, i16, j32));
      const std::uint32_t words[4] = {r.x, r.y, r.z, r.w};
      for (int w = 0; w < 4; ++w)
        for (int k = 0; k < 4; ++k) {
          const int ri = (lane >> 2) + 8 * (k >> 1), cj = 8 * w + 2 * (lane & 3) + (k & 1);
          values[ri][cj] = std::uint8_t(detail::byte_of(words[w], k));
        }
    }
  }

  // z[n * kRows + m] = keep factor of query row0 + m and key key0 + n, for m < rows and n < keys
  // (the transposed tiles of the fast path); 0 for padding rows m >= rows.
  template <int kRows>
  void factors(int b, int h, int row0, int rows, int key0, int keys, float* z) const {
    std::uint8_t values[16][32];
    for (int n = 0; n < keys; ++n) std::fill_n(z + std::int64_t(n) * kRows + rows, kRows - rows, 0.0f);
    for (int i16 = row0 >> 4; i16 <= (row0 + rows - 1) >> 4; ++i16)
      for (int j32 = key0 >> 5; j32 <= (key0 + keys - 1) >> 5; ++j32) {
        block(b, h, i16, j32, values);
        const int i_begin = std::max(row0, i16 * 16), i_end = std::min(row0 + rows, i16 * 16 + 16);
        const int j_begin = std::max(key0, j32 * 32), j_end = std::min(key0 + keys, j32 * 32 + 32);
        for (int j = j_begin; j < j_end; ++j) {
          float* z_row = z + std::int64_t(j - key0) * kRows;
          for (int i = i_begin; i < i_end; ++i)
            z_row[i - row0] = values[i & 15][j & 31] >= threshold ? keep_scale : 0.0f;
        }
      }
  }
};

}  // namespace flashattn::cpu
