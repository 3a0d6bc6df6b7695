// quantize_e4m3 (flashattn/fp8.hpp) on the CPU: against float64 (the transform as an explicit
// Hadamard matrix, the factors as amax / 448, every value within e4m3's rounding), odd shapes,
// GQA slots, per tensor, per block of rows, and its argument checks. The CUDA kernels must give the same bits
// (test_cuda_backend.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "flashattn/error.hpp"
#include "flashattn/fp8.hpp"
#include "host_tensor.hpp"

namespace flashattn {
namespace {

using host::HostTensor;

// H diag(signs) / sqrt(d), Sylvester's construction: entry (i, j) = signs[i] (-1)^popcount(i & j) / sqrt(d).
double transform_entry(const std::vector<float>& signs, int i, int j) {
  return signs[i] * (__builtin_popcount(unsigned(i & j)) % 2 ? -1.0 : 1.0) / std::sqrt(double(signs.size()));
}

struct Quantized {
  HostTensor out, descale;
};

enum class Scales { per_head, per_tensor, per_block };


Quantized quantize(const HostTensor& x, int heads_kv, Scales scales, const HostTensor* signs) {
  const auto& s = x.shape();
  const bool per_tensor = scales == Scales::per_tensor, per_block = scales == Scales::per_block;
  Quantized q{HostTensor(DType::e4m3, s), per_tensor  ? HostTensor(DType::f32, {1})
                                          : per_block ? HostTensor(DType::f32, {s[0], heads_kv, fp8_scale_blocks(s[1])})
                                                      : HostTensor(DType::f32, {s[0], heads_kv})};
  q.out.poison();
  q.descale.poison();
  QuantizeArgs a;
  a.x = const_cast<HostTensor&>(x).view();
  a.out = q.out.view();
  a.descale = q.descale.view();
  if (signs) a.signs = const_cast<HostTensor*>(signs)->view();
  a.heads_kv = heads_kv;
  a.per_tensor = per_tensor;
  a.per_block = per_block;
  quantize_e4m3(a);
  return q;
}

// The factors' index, written out here from the documented shapes, not taken from the library.
void expect_close_to_float64(const HostTensor& x, const Quantized& q, int heads_kv, Scales scales,
                             const std::vector<float>* signs) {
  const auto& s = x.shape();
  const int batch = int(s[0]), seqlen = int(s[1]), heads = int(s[2]), d = int(s[3]);
  const int blocks = int(fp8_scale_blocks(seqlen));
  auto slot_of = [&](int b, int t, int h) {
    const int kv = b * heads_kv + h / (heads / heads_kv);
    return scales == Scales::per_tensor  ? 0
           : scales == Scales::per_block ? kv * blocks + t / kFp8ScaleBlockRows
                                         : kv;
  };
  auto exact = [&](int b, int t, int h, int j) {
    const std::int64_t row = ((std::int64_t(b) * seqlen + t) * heads + h) * d;
    if (!signs) return double(x.get(row + j));
    double v = 0;
    for (int i = 0; i < d; ++i) v += double(x.get(row + i)) * transform_entry(*signs, i, j);
    return v;
  };
  std::vector<double> amax(std::size_t(q.descale.numel()), 0.0);
  for (int b = 0; b < batch; ++b)
    for (int t = 0; t < seqlen; ++t)
      for (int h = 0; h < heads; ++h)
        for (int j = 0; j < d; ++j) {
          double& m = amax[std::size_t(slot_of(b, t, h))];
          m = std::max(m, std::abs(exact(b, t, h, j)));
        }
  for (std::size_t i = 0; i < amax.size(); ++i)
    EXPECT_NEAR(q.descale.get(std::int64_t(i)), amax[i] / 448.0, 1e-6 * amax[i] / 448.0 + 1e-30) << "slot " << i;
  for (int b = 0; b < batch; ++b)
    for (int t = 0; t < seqlen; ++t)
      for (int h = 0; h < heads; ++h)
        for (int j = 0; j < d; ++j) {
          const int slot = slot_of(b, t, h);
          const double factor = q.descale.get(slot), want = exact(b, t, h, j);
          const double got = q.out.get(((std::int64_t(b) * seqlen + t) * heads + h) * d + j) * factor;
          // Round to nearest: 2^-4 of the value in e4m3's normals, half a subnormal step (2^-10)
          // below them; plus float32's error in the transform.
          ASSERT_LE(std::abs(got - want), 0x1p-4 * std::abs(want) + 0x1p-10 * factor + 1e-5 * amax[std::size_t(slot)])
              << b << " " << t << " " << h << " " << j;
        }
}

TEST(QuantizeE4m3, PerHeadAndPerTensorWithinE4m3Rounding) {
  std::mt19937_64 rng(7);
  for (DType dtype : {DType::f32, DType::bf16}) {
    HostTensor x(dtype, {2, 13, 6, 40});  // a head dim that is no power of two (no transform)
    x.fill_normal(rng, 3.0f);
    for (Scales scales : {Scales::per_head, Scales::per_tensor}) {
      const Quantized q = quantize(x, 3, scales, nullptr);
      expect_close_to_float64(x, q, 3, scales, nullptr);
    }
  }
}

// Block quantization: three blocks of rows, the last partial, with GQA slots and the transform;
// an outlier in one block must not change the other blocks' factors.
TEST(QuantizeE4m3, PerBlockFactorsFollowEachBlockOfRows) {
  std::mt19937_64 rng(9);
  HostTensor x(DType::bf16, {2, 2 * kFp8ScaleBlockRows + 37, 4, 32});
  x.fill_normal(rng);
  x.set(((std::int64_t(1) * x.shape()[1] + kFp8ScaleBlockRows + 5) * 4 + 3) * 32 + 7, 200.0f);  // b 1, block 1, head 3
  std::vector<float> signs(32);
  HostTensor signs_t(DType::f32, {32});
  for (int i = 0; i < 32; ++i) signs_t.set(i, signs[i] = (rng() & 1) ? 1.0f : -1.0f);
  for (const HostTensor* transform : std::vector<const HostTensor*>{nullptr, &signs_t}) {
    const Quantized q = quantize(x, 2, Scales::per_block, transform);
    expect_close_to_float64(x, q, 2, Scales::per_block, transform ? &signs : nullptr);
    // (b 1, KV head 1): block 1 holds the outlier, blocks 0 and 2 do not.
    const std::int64_t kv = (1 * 2 + 1) * 3;
    EXPECT_GT(q.descale.get(kv + 1), 4 * q.descale.get(kv + 0));
    EXPECT_GT(q.descale.get(kv + 1), 4 * q.descale.get(kv + 2));
  }
}

TEST(QuantizeE4m3, HadamardTransformIsFusedBeforeTheRounding) {
  std::mt19937_64 rng(8);
  HostTensor x(DType::f32, {1, 9, 4, 64});
  x.fill_normal(rng);
  x.set(5, 40.0f);  // an outlier: the transform spreads it over the row
  std::vector<float> signs(64);
  HostTensor signs_t(DType::f32, {64});
  for (int i = 0; i < 64; ++i) signs_t.set(i, signs[i] = (rng() & 1) ? 1.0f : -1.0f);
  const Quantized q = quantize(x, 2, Scales::per_head, &signs_t);
  expect_close_to_float64(x, q, 2, Scales::per_head, &signs);
}

TEST(QuantizeE4m3, ArgumentChecks) {
  HostTensor x(DType::f32, {1, 4, 4, 48}), out(DType::e4m3, {1, 4, 4, 48}), descale(DType::f32, {1, 2});
  HostTensor wrong_out(DType::bf16, {1, 4, 4, 48}), signs(DType::f32, {48});
  auto call = [&](auto change) {
    QuantizeArgs a;
    a.x = x.view();
    a.out = out.view();
    a.descale = descale.view();
    a.heads_kv = 2;
    change(a);
    quantize_e4m3(a);
  };
  auto expect_error = [&](auto change, const std::string& argument) {
    try {
      call(change);
      ADD_FAILURE() << "no error about " << argument;
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), argument) << e.what();
    }
  };
  EXPECT_NO_THROW(call([](QuantizeArgs&) {}));
  expect_error([&](QuantizeArgs& a) { a.out = wrong_out.view(); }, "out.dtype");
  expect_error([&](QuantizeArgs& a) { a.heads_kv = 3; }, "heads_kv");
  expect_error([&](QuantizeArgs& a) { a.per_tensor = true; }, "descale");
  expect_error([&](QuantizeArgs& a) { a.per_block = true; }, "descale");  // (1, 2): no blocks axis
  expect_error([&](QuantizeArgs& a) { a.per_block = a.per_tensor = true; }, "per_block");
  expect_error([&](QuantizeArgs& a) { a.signs = signs.view(); }, "x.shape[3] (head_dim)");  // 48: no power of two
}

}  // namespace
}  // namespace flashattn
