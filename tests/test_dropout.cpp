// Dropout's random stream (src/common/philox.hpp): the generator against published values,
// the CPU backend and the float64 reference dropping the same entries, the dropped fraction,
// and the arguments' validation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
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

// Known-answer vectors of Philox4x32-10 (Random123's kat_vectors): counter, key (k0 low word
// of the seed), result.
TEST(Philox, MatchesPublishedVectors) {
  struct Kat {
    PhiloxWords counter;
    std::uint32_t k0, k1;
    PhiloxWords expected;
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, 0, 0, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
      {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, 0xffffffffu, 0xffffffffu,
       {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
      {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, 0xa4093822u, 0x299f31d0u,
       {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
  };
  for (const Kat& k : kats) {
    const PhiloxWords r = detail::philox4x32_10((std::uint64_t(k.k1) << 32) | k.k0, k.counter);
    EXPECT_EQ(r.x, k.expected.x);
    EXPECT_EQ(r.y, k.expected.y);
    EXPECT_EQ(r.z, k.expected.z);
    EXPECT_EQ(r.w, k.expected.w);
  }
}

// The sm90 forward's calls along a row of blocks (common/philox_row.hpp) give exactly the
// generator's words, on random keys and counters and on the corners of every word.
TEST(Philox, RowCallsMatchTheGenerator) {
  std::mt19937_64 rng(test_seed());
  const std::uint32_t corners[] = {0u, 1u, 0x7fffffffu, 0x80000000u, 0xffffffffu};
  for (int trial = 0; trial < 2000; ++trial) {
    const std::uint64_t seed = trial < 5 ? std::uint64_t(corners[trial]) * 0x100000001ull : rng();
    auto word = [&](int k) { return trial < 25 ? corners[(trial + k) % 5] : std::uint32_t(rng()); };
    const std::uint32_t x = word(0), y = word(1), z = word(2);
    const detail::PhiloxRow row(seed, x, y, z);
    for (int call = 0; call < 4; ++call) {
      const std::uint32_t w = call == 0 ? word(3) : std::uint32_t(rng());
      const PhiloxWords expected = detail::philox4x32_10(seed, {x, y, z, w}), got = row(w);
      ASSERT_EQ(got.x, expected.x) << "seed " << seed << " counter " << x << " " << y << " " << z << " " << w;
      ASSERT_EQ(got.y, expected.y);
      ASSERT_EQ(got.z, expected.z);
      ASSERT_EQ(got.w, expected.w);
    }
  }
}

// keep_byte's whole-word compares keep exactly the elements whose 16-bit value reaches the
// threshold, bit 2 * word + half.
TEST(Philox, KeepByteComparesEachHalfWithTheThreshold) {
  std::mt19937_64 rng(test_seed());
  const std::uint32_t halves[] = {0u, 1u, 2u, 0x7fffu, 0x8000u, 0xfffeu, 0xffffu};
  for (std::uint32_t threshold : {0u, 1u, 2u, 11141u, 32768u, 65534u, 65535u}) {
    for (int trial = 0; trial < 500; ++trial) {
      std::uint32_t words[4];
      for (std::uint32_t& w : words) {
        const std::uint32_t lo = trial < 49 ? halves[trial % 7] : std::uint32_t(rng()) & 0xffffu;
        const std::uint32_t hi = trial < 49 ? halves[trial / 7] : std::uint32_t(rng()) & 0xffffu;
        w = hi << 16 | lo;
      }
      const std::uint32_t byte = detail::keep_byte({words[0], words[1], words[2], words[3]}, threshold);
      for (int b = 0; b < 8; ++b) {
        const std::uint32_t value = b % 2 ? words[b / 2] >> 16 : words[b / 2] & 0xffffu;
        EXPECT_EQ((byte >> b) & 1u, value >= threshold ? 1u : 0u) << "threshold " << threshold << " value " << value;
      }
      EXPECT_EQ(byte >> 8, 0u);
    }
  }
}

// The stream's layout: every lane of a 16 x 16 block uses its own counter, and its 8 elements
// take the call's 8 16-bit halves, each exactly once.
TEST(Philox, EveryElementOfABlockTakesItsOwnHalfWord) {
  std::vector<int> uses(32 * 8, 0);
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      const int lane = detail::dropout_lane(i, j);
      ++uses[lane * 8 + detail::dropout_word(i, j) * 2 + detail::dropout_half(j)];
    }
  for (int u : uses) EXPECT_EQ(u, 1);
}

TEST(Philox, ThresholdRoundsToSixteenBits) {
  EXPECT_EQ(detail::dropout_threshold(0.0), 0u);
  EXPECT_EQ(detail::dropout_threshold(0.5), 32768u);
  EXPECT_EQ(detail::dropout_threshold(0.17), 11141u);  // round(0.17 * 65536 = 11141.12)
  EXPECT_EQ(detail::dropout_threshold(0.99999999), 65535u);
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

// The CPU backend (16 x 16 blocks at once, tiles at any alignment) and the reference (element
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
