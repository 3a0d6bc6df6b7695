// Dropout's random stream (src/common/philox.hpp): the generator against published values,
// the CPU backend and the float64 reference dropping the same entries, the dropped fraction,
// and the arguments' validation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "common/philox.hpp"
#include "common/philox_row.hpp"
#include "flashattn/attention.hpp"
#include "flashattn/error.hpp"
#include "host_tensor.hpp"
#include "support/harness.hpp"

namespace flashattn::testing {
namespace {

using detail::PhiloxWords;

// Known-answer vectors of Philox4x32-10 and -7 (Random123's kat_vectors): counter, key (k0 low
// word of the seed), result.
struct Kat {
  PhiloxWords counter;
  std::uint32_t k0, k1;
  PhiloxWords expected;
};

template <int kRounds>
void expect_known_answers(const Kat (&kats)[3]) {
  for (const Kat& k : kats) {
    const PhiloxWords r = detail::philox4x32<kRounds>((std::uint64_t(k.k1) << 32) | k.k0, k.counter);
    EXPECT_EQ(r.x, k.expected.x) << kRounds << " rounds";
    EXPECT_EQ(r.y, k.expected.y) << kRounds << " rounds";
    EXPECT_EQ(r.z, k.expected.z) << kRounds << " rounds";
    EXPECT_EQ(r.w, k.expected.w) << kRounds << " rounds";
  }
}

TEST(Philox, MatchesPublishedVectors) {
  constexpr PhiloxWords kZero{0, 0, 0, 0}, kOnes{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu};
  constexpr PhiloxWords kPi{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u};
  const Kat ten[] = {
      {kZero, 0, 0, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
      {kOnes, 0xffffffffu, 0xffffffffu, {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
      {kPi, 0xa4093822u, 0x299f31d0u, {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
  };
  const Kat seven[] = {
      {kZero, 0, 0, {0x5f6fb709u, 0x0d893f64u, 0x4f121f81u, 0x4f730a48u}},
      {kOnes, 0xffffffffu, 0xffffffffu, {0x5207ddc2u, 0x45165e59u, 0x4d8ee751u, 0x8c52f662u}},
      {kPi, 0xa4093822u, 0x299f31d0u, {0x4dfccabau, 0x190a87f0u, 0xc47362bau, 0xb6b5242au}},
  };
  expect_known_answers<10>(ten);
  expect_known_answers<7>(seven);
  static_assert(detail::kDropoutRounds == 7, "dropout's stream is Philox4x32-7");
}

// The sm90 forward's calls along a row of blocks (common/philox_row.hpp) give exactly the
// generator's words, on random keys and counters and on the corners of every word.
template <int kRounds>
void expect_row_calls_match_the_generator() {
  std::mt19937_64 rng(test_seed());
  const std::uint32_t corners[] = {0u, 1u, 0x7fffffffu, 0x80000000u, 0xffffffffu};
  for (int trial = 0; trial < 2000; ++trial) {
    const std::uint64_t seed = trial < 5 ? std::uint64_t(corners[trial]) * 0x100000001ull : rng();
    auto word = [&](int k) { return trial < 25 ? corners[(trial + k) % 5] : std::uint32_t(rng()); };
    const std::uint32_t x = word(0), y = word(1), z = word(2);
    const detail::PhiloxRow<kRounds> row(seed, x, y, z);
    for (int call = 0; call < 4; ++call) {
      const std::uint32_t w = call == 0 ? word(3) : std::uint32_t(rng());
      const PhiloxWords expected = detail::philox4x32<kRounds>(seed, {x, y, z, w}), got = row(w);
      ASSERT_EQ(got.x, expected.x) << kRounds << " rounds, seed " << seed << " counter " << x << " " << y << " " << z
                                   << " " << w;
      ASSERT_EQ(got.y, expected.y);
      ASSERT_EQ(got.z, expected.z);
      ASSERT_EQ(got.w, expected.w);
    }
  }
}

TEST(Philox, RowCallsMatchTheGenerator) {
  expect_row_calls_match_the_generator<detail::kDropoutRounds>();
  expect_row_calls_match_the_generator<10>();
  expect_row_calls_match_the_generator<4>();
}

// ByteKeepTest's four compares at once keep exactly the bytes that reach the threshold, for
// every threshold and every byte value in every position.
TEST(Philox, ByteKeepTestComparesEachByteWithTheThreshold) {
  std::mt19937_64 rng(test_seed());
  for (std::uint32_t threshold = 0; threshold < 256; ++threshold) {
    const detail::ByteKeepTest test(threshold);
    for (int trial = 0; trial < 256 + 200; ++trial) {
      // Every byte value in every position (the others random), then random words.
      const std::uint32_t r = std::uint32_t(rng());
      const std::uint32_t w = trial < 256 ? (r & 0xffffff00u) | std::uint32_t(trial) : r;
      const std::uint32_t rotated[4] = {w, (w << 8) | (w >> 24), (w << 16) | (w >> 16), (w << 24) | (w >> 8)};
      for (std::uint32_t word : rotated) {
        const std::uint32_t kept = test.kept_msbs(word);
        for (int k = 0; k < 4; ++k) {
          const std::uint32_t value = (word >> (8 * k)) & 0xffu;
          ASSERT_EQ((kept >> (8 * k + 7)) & 1u, value >= threshold ? 1u : 0u)
              << "threshold " << threshold << " value " << value;
        }
        ASSERT_EQ(kept & ~detail::ByteKeepTest::kTopBits, 0u);
      }
    }
  }
}

// The stream's layout: every lane of a 16 x 32 block uses its own counter, and its 16 elements
// take the call's 16 bytes, each exactly once; the bytes of a word are the four elements of one
// n8 tile in the m16n8 accumulator's order.
TEST(Philox, EveryElementOfABlockTakesItsOwnByte) {
  std::vector<int> uses(32 * 16, 0);
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 32; ++j) {
      const int lane = detail::dropout_lane(i, j);
      EXPECT_EQ(lane, (i % 8) * 4 + (j % 8) / 2);
      EXPECT_EQ(detail::dropout_word(j), j / 8);
      EXPECT_EQ(detail::dropout_byte(i, j), 2 * (i / 8) + j % 2);  // m16n8 order: (a, 2t), (a, 2t+1), (a+8, ...)
      ++uses[lane * 16 + detail::dropout_word(j) * 4 + detail::dropout_byte(i, j)];
    }
  for (int u : uses) EXPECT_EQ(u, 1);
}

TEST(Philox, ThresholdRoundsToEightBits) {
  EXPECT_EQ(detail::dropout_threshold(0.0), 0u);
  EXPECT_EQ(detail::dropout_threshold(0.001), 0u);  // below half a step: nothing dropped
  EXPECT_EQ(detail::dropout_threshold(0.1), 26u);   // round(25.6)
  EXPECT_EQ(detail::dropout_threshold(0.17), 44u);  // round(43.52)
  EXPECT_EQ(detail::dropout_threshold(0.5), 128u);
  EXPECT_EQ(detail::dropout_threshold(0.99999999), 255u);
}

// The bytes are uniform and the elements independent, as far as 2^20 draws can tell: each byte
// value about equally often, and a kept element's neighbours (next key, next row, the same
// element of the next block) kept as often as any.
TEST(DropoutStream, BytesLookUniformAndIndependent) {
  const std::uint64_t seed = test_seed() * 0x9E3779B97F4A7C15ull + 1;
  constexpr int kRows = 256, kKeys = 1024;
  std::vector<std::uint8_t> v(std::size_t(kRows) * kKeys);
  for (int i = 0; i < kRows; ++i)
    for (int j = 0; j < kKeys; ++j)
      v[std::size_t(i) * kKeys + j] = std::uint8_t(detail::dropout_value(seed, 64, 1, 4, 2, i, j));
  std::vector<double> count(256, 0.0);
  for (std::uint8_t x : v) count[x] += 1.0;
  const double expected = double(v.size()) / 256.0;
  double chi2 = 0.0;
  for (double c : count) chi2 += (c - expected) * (c - expected) / expected;
  EXPECT_LT(chi2, 400.0) << "seed " << seed;  // 255 degrees of freedom: mean 255, sd 22.6
  // P(both kept) against P(kept)^2 at p = 0.5 (the top bit), for three neighbour offsets.
  for (auto [di, dj] : {std::pair{0, 1}, std::pair{1, 0}, std::pair{16, 32}}) {
    double both = 0.0, pairs = 0.0;
    for (int i = 0; i + di < kRows; ++i)
      for (int j = 0; j + dj < kKeys; ++j) {
        both += (v[std::size_t(i) * kKeys + j] >> 7) & (v[std::size_t(i + di) * kKeys + j + dj] >> 7);
        pairs += 1.0;
      }
    EXPECT_NEAR(both / pairs, 0.25, 0.005) << "offset (" << di << ", " << dj << "), seed " << seed;  // sd 0.0009
  }
}

Case pattern_case() {
  Case c;
  c.name = "dropout_pattern";
  c.batch = 2;
  c.heads_q = 3;
  c.heads_kv = 1;
  c.seqlen_q = 200;
  c.seqlen_k = 300;  // keys beyond head_dim: dropout_kept_entries' weighted columns
  c.head_dim = 128;
  c.dropout_p = 0.17f;
  return c;
}

// The CPU backend (16 x 32 blocks at once, tiles at any alignment) and the reference (element
// by element from the definition) keep exactly the same entries, and drop about p of them.
TEST(DropoutStream, CpuBackendAndReferenceDropTheSameEntries) {
  for (bool causal : {false, true}) {
    Case c = pattern_case();
    c.causal = causal;
    const std::uint64_t seed = test_seed();
    const std::vector<bool> cpu = dropout_kept_entries(c, DType::f32, DeviceKind::cpu, seed);
    const std::vector<bool> ref = dropout_kept_entries(c, DType::f32, DeviceKind::cpu, seed, true);
    ASSERT_EQ(cpu.size(), ref.size());
    std::int64_t differ = 0, visible = 0, kept = 0;
    for (std::size_t e = 0; e < cpu.size(); ++e) {
      differ += cpu[e] != ref[e];
      const int j = int(e % c.seqlen_k), i = int(e / c.seqlen_k % c.seqlen_q);
      if (!causal || j <= i + c.seqlen_k - c.seqlen_q) {
        ++visible;
        kept += cpu[e];
      } else {
        EXPECT_FALSE(cpu[e]) << "a masked entry came out nonzero";
      }
    }
    EXPECT_EQ(differ, 0) << "seed " << seed << ", causal " << causal;
    const double dropped = 1.0 - double(kept) / double(visible);
    EXPECT_NEAR(dropped, 0.17, 0.01) << "seed " << seed;  // 50k+ entries: ~6 sigma
  }
}

// Another seed or offset gives another mask.
TEST(DropoutStream, SeedAndOffsetChangeTheMask) {
  const Case c = pattern_case();
  const std::vector<bool> a = dropout_kept_entries(c, DType::f32, DeviceKind::cpu, 1);
  const std::vector<bool> b = dropout_kept_entries(c, DType::f32, DeviceKind::cpu, 2);
  std::int64_t differ = 0;
  for (std::size_t e = 0; e < a.size(); ++e) differ += a[e] != b[e];
  EXPECT_GT(differ, std::int64_t(a.size()) / 5);
}

struct SmallCall {
  host::HostTensor q{DType::f32, {1, 4, 2, 8}}, k{DType::f32, {1, 4, 2, 8}}, v{DType::f32, {1, 4, 2, 8}};
  host::HostTensor out{DType::f32, {1, 4, 2, 8}};
  ForwardArgs args() {
    ForwardArgs a;
    a.q = q.view();
    a.k = k.view();
    a.v = v.view();
    a.out = out.view();
    return a;
  }
};

void expect_rejected(const ForwardArgs& a, const std::string& argument) {
  try {
    forward(a);
    ADD_FAILURE() << "accepted; expected an error naming " << argument;
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), argument) << e.what();
  }
}

TEST(DropoutValidation, RejectsBadProbabilitiesAndStates) {
  SmallCall call;
  for (float p : {-0.1f, 1.0f, 1.5f, NAN, INFINITY}) {
    ForwardArgs a = call.args();
    a.dropout_p = p;
    expect_rejected(a, "dropout_p");
  }
  host::HostTensor i32_state(DType::i32, {2}), long_state(DType::i64, {3}), good(DType::i64, {2});
  ForwardArgs a = call.args();
  a.dropout_p = 0.1f;
  a.dropout_state = i32_state.view();
  expect_rejected(a, "dropout_state.dtype");
  a.dropout_state = long_state.view();
  expect_rejected(a, "dropout_state.shape");
  a.dropout_state = good.view();
  EXPECT_NO_THROW(forward(a));
}

// The state tensor and the values give the same mask.
TEST(DropoutValidation, StateTensorEqualsValues) {
  SmallCall call;
  std::mt19937_64 rng(7);
  for (auto* t : {&call.q, &call.k, &call.v}) t->fill_normal(rng);
  host::HostTensor state(DType::i64, {2});
  static_cast<std::uint64_t*>(state.data())[0] = 99;
  static_cast<std::uint64_t*>(state.data())[1] = 1ull << 40;
  ForwardArgs a = call.args();
  a.dropout_p = 0.5f;
  a.dropout_seed = 99;
  a.dropout_offset = 1ull << 40;
  forward(a);
  const std::vector<float> by_value = call.out.to_floats();
  a.dropout_seed = a.dropout_offset = 0;
  a.dropout_state = state.view();
  forward(a);
  EXPECT_EQ(call.out.to_floats(), by_value);
}

}  // namespace
}  // namespace flashattn::testing
