// The float64 reference checks itself: gradients against finite differences of its own forward,
// closed-form cases, and the host dtype conversions it relies on.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "common/numeric.hpp"
#include "flashattn/reference.hpp"
#include "host_tensor.hpp"
#include "support/cases.hpp"

namespace flashattn {
namespace {

using host::HostTensor;
using testing::Case;

struct Tensors {
  HostTensor q, k, v, out, lse, dout, slopes;
  explicit Tensors(const Case& c)
      : q(DType::f32, {c.batch, c.seqlen_q, c.heads_q, c.head_dim}),
        k(DType::f32, {c.batch, c.seqlen_k, c.heads_kv, c.head_dim}),
        v(DType::f32, {c.batch, c.seqlen_k, c.heads_kv, c.head_dim}),
        out(DType::f32, {c.batch, c.seqlen_q, c.heads_q, c.head_dim}),
        lse(DType::f32, {c.batch, c.heads_q, c.seqlen_q}),
        dout(DType::f32, {c.batch, c.seqlen_q, c.heads_q, c.head_dim}),
        slopes(c.alibi == testing::Alibi::batch_heads ? HostTensor(DType::f32, {c.batch, c.heads_q})
                                                      : HostTensor(DType::f32, {c.heads_q})) {
    for (std::int64_t i = 0; i < slopes.numel(); ++i) slopes.set(i, 0.25f + 0.5f * float(i));
  }
};

void options(AttentionOptions& o, const Case& c, Tensors& t) {
  if (c.alibi != testing::Alibi::none) o.alibi_slopes = t.slopes.view();
  o.causal = c.causal;
  o.window_left = c.window_left;
  o.window_right = c.window_right;
  o.softcap = c.softcap;
  o.dropout_p = c.dropout_p;  // a fixed stream: the mask is a constant of the function
  o.dropout_seed = 0x1234567890abcdefull;
  o.dropout_offset = 96;
}

// loss = sum(out * dout), in double, from the reference forward.
double loss(const Case& c, Tensors& t) {
  ForwardArgs a;
  options(a, c, t);
  a.q = t.q.view();
  a.k = t.k.view();
  a.v = t.v.view();
  a.out = t.out.view();
  a.lse = t.lse.view();
  reference::forward(a);
  double l = 0;
  for (std::int64_t i = 0; i < t.out.numel(); ++i) l += double(t.out.get(i)) * t.dout.get(i);
  return l;
}

class ReferenceGradients : public ::testing::TestWithParam<Case> {};

TEST_P(ReferenceGradients, MatchFiniteDifferences) {
  const Case c = GetParam();
  Tensors t(c);
  std::mt19937_64 rng(42);
  for (HostTensor* x : {&t.q, &t.k, &t.v, &t.dout}) x->fill_normal(rng);
  loss(c, t);
  HostTensor dq(DType::f32, t.q.shape()), dk(DType::f32, t.k.shape()), dv(DType::f32, t.v.shape());
  BackwardArgs b;
  options(b, c, t);
  b.q = t.q.view();
  b.k = t.k.view();
  b.v = t.v.view();
  b.out = t.out.view();
  b.lse = t.lse.view();
  b.dout = t.dout.view();
  b.dq = dq.view();
  b.dk = dk.view();
  b.dv = dv.view();
  reference::backward(b);

  const double eps = 1e-2;
  const std::pair<HostTensor*, HostTensor*> pairs[] = {{&t.q, &dq}, {&t.k, &dk}, {&t.v, &dv}};
  for (auto [x, grad] : pairs) {
    for (std::int64_t i = 0; i < x->numel(); ++i) {
      const float x0 = x->get(i);
      x->set(i, x0 + float(eps));
      const double up = loss(c, t);
      x->set(i, x0 - float(eps));
      const double down = loss(c, t);
      x->set(i, x0);
      const double fd = (up - down) / (2 * eps);
      EXPECT_NEAR(grad->get(i), fd, 2e-3 * (1 + std::abs(fd))) << "element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tiny, ReferenceGradients, ::testing::ValuesIn(testing::tiny_cases()),
                         [](const auto& info) { return info.param.name; });

TEST(Reference, ZeroQueriesAverageTheValues) {
  // q = 0: every visible key gets the same weight, so out is the mean of the visible values.
  Case c;
  c.heads_q = c.heads_kv = 1;
  c.seqlen_q = 3;
  c.seqlen_k = 5;
  c.head_dim = 2;
  c.causal = true;  // bottom-right: row i sees keys 0 .. i + 2
  Tensors t(c);
  std::mt19937_64 rng(7);
  t.k.fill_normal(rng);
  t.v.fill_normal(rng);
  for (std::int64_t i = 0; i < t.q.numel(); ++i) t.q.set(i, 0);
  loss(c, t);
  for (int i = 0; i < 3; ++i) {
    for (int d = 0; d < 2; ++d) {
      double mean = 0;
      for (int j = 0; j <= i + 2; ++j) mean += t.v.get(j * 2 + d);
      mean /= i + 3;
      EXPECT_NEAR(t.out.get(i * 2 + d), mean, 1e-6);
    }
    EXPECT_NEAR(t.lse.get(i), std::log(double(i + 3)), 1e-6);
  }
}

TEST(Reference, AlibiIsFlashAttnsBias) {
  // q = 0: the scores are the bias alone, so row i's weights are exp(-slope * |i + 3 - j|)
  // normalized over its visible keys (seqlen_q = 3, seqlen_k = 6: shift 3), and its LSE is
  // log(sum exp(bias)). Causal: the same bias on keys j <= i + 3 (flash-attn's causal kernels add
  // slope * j instead, the same up to a constant per row; the reference takes the form above).
  for (bool causal : {false, true}) {
    Case c;
    c.heads_q = c.heads_kv = 2;
    c.seqlen_q = 3;
    c.seqlen_k = 6;
    c.head_dim = 2;
    c.causal = causal;
    c.alibi = testing::Alibi::heads;  // slopes 0.25 and 0.75 (Tensors)
    Tensors t(c);
    std::mt19937_64 rng(9);
    t.k.fill_normal(rng);
    t.v.fill_normal(rng);
    for (std::int64_t i = 0; i < t.q.numel(); ++i) t.q.set(i, 0);
    loss(c, t);
    for (int h = 0; h < 2; ++h) {
      const double slope = 0.25 + 0.5 * h;
      for (int i = 0; i < 3; ++i) {
        const int last = causal ? i + 3 : 5;
        double sum = 0, out[2] = {0, 0};
        for (int j = 0; j <= last; ++j) {
          const double w = std::exp(-slope * std::abs(i + 3 - j));
          sum += w;
          for (int d = 0; d < 2; ++d) out[d] += w * t.v.get((j * 2 + h) * 2 + d);
        }
        for (int d = 0; d < 2; ++d)
          EXPECT_NEAR(t.out.get((i * 2 + h) * 2 + d), out[d] / sum, 1e-6) << "causal " << causal;
        EXPECT_NEAR(t.lse.get(h * 3 + i), std::log(sum), 1e-6) << "causal " << causal;
      }
    }
  }
}

TEST(Reference, FullyMaskedRowsAreZeroWithNegativeInfinityLse) {
  Case c;
  c.heads_q = c.heads_kv = 1;
  c.seqlen_q = 5;
  c.seqlen_k = 2;
  c.head_dim = 4;
  c.causal = true;  // rows 0..2 see no key (bottom-right alignment)
  Tensors t(c);
  std::mt19937_64 rng(8);
  for (HostTensor* x : {&t.q, &t.k, &t.v}) x->fill_normal(rng);
  loss(c, t);
  for (int i = 0; i < 5; ++i) {
    const bool masked = i < 3;
    EXPECT_EQ(std::isinf(t.lse.get(i)) && t.lse.get(i) < 0, masked) << "row " << i;
    if (masked)
      for (int d = 0; d < 4; ++d) EXPECT_EQ(t.out.get(i * 4 + d), 0.0f);
  }
}

TEST(Numeric, HalfAndBfloat16RoundTrip) {
  using namespace detail;
  // Every finite half converts to float and back unchanged.
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00) continue;  // inf / NaN
    EXPECT_EQ(float_to_half(half_to_float(std::uint16_t(h))), h) << std::hex << h;
  }
  // Round to nearest even at the halfway point, overflow to inf, NaN stays NaN.
  EXPECT_EQ(float_to_half(1.0f + 1.0f / 2048), 0x3c00);          // halfway, rounds to even (down)
  EXPECT_EQ(float_to_half(1.0f + 3.0f / 2048), 0x3c02);          // halfway, rounds to even (up)
  EXPECT_EQ(float_to_half(65520.0f), 0x7c00);
  EXPECT_EQ(float_to_half(65519.0f), 0x7bff);
  EXPECT_EQ(float_to_half(5.9604644775390625e-8f), 0x0001);     // smallest subnormal
  EXPECT_TRUE(std::isnan(half_to_float(float_to_half(std::nanf("")))));
  EXPECT_EQ(float_to_bf16(1.0f + 1.0f / 256), 0x3f80);          // halfway, to even
  EXPECT_EQ(float_to_bf16(1.0f + 3.0f / 256), 0x3f82);
  EXPECT_EQ(bf16_to_float(0x3f80), 1.0f);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
}

}  // namespace
}  // namespace flashattn
