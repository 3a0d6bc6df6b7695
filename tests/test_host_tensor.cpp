// The host-side helpers the benchmarks and the command line rely on for their inputs.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>

#include "common/numeric.hpp"
#include "host_tensor.hpp"

namespace {

using flashattn::DType;
using flashattn::host::HostTensor;

// Mean and standard deviation of a tensor's values.
std::pair<double, double> moments(const HostTensor& t) {
  double sum = 0, sq = 0;
  const auto values = t.to_floats();
  for (float x : values) {
    sum += x;
    sq += double(x) * x;
  }
  const double mean = sum / values.size();
  return {mean, std::sqrt(sq / values.size() - mean * mean)};
}

TEST(HostTensor, ParallelNormalFillHasTheRequestedMoments) {
  HostTensor t(DType::f32, {1, 512, 4, 64});  // 131072 values: moments within ~1%
  t.fill_normal_parallel(7, 2.0f);
  const auto [mean, stddev] = moments(t);
  EXPECT_NEAR(mean, 0.0, 0.03);
  EXPECT_NEAR(stddev, 2.0, 0.03);
  for (float x : t.to_floats()) ASSERT_TRUE(std::isfinite(x));
}

TEST(HostTensor, ParallelNormalFillDependsOnSeedNotThreads) {
  HostTensor a(DType::bf16, {2, 300, 3, 32}), b(DType::bf16, {2, 300, 3, 32}), c(DType::bf16, {2, 300, 3, 32});
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  a.fill_normal_parallel(11);
  omp_set_num_threads(std::max(2, threads));
  b.fill_normal_parallel(11);
  omp_set_num_threads(threads);
  c.fill_normal_parallel(12);
  EXPECT_EQ(a.to_floats(), b.to_floats());
  EXPECT_NE(a.to_floats(), c.to_floats());
}

// e4m3 on the host (FP8 inputs for tests and the command line): every code decodes and encodes
// back to itself, halfway values round to the even code, and the range saturates at +-448.
TEST(HostTensor, E4m3ConversionsRoundToNearestEven) {
  using flashattn::detail::e4m3_to_float;
  using flashattn::detail::float_to_e4m3;
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(e4m3_to_float(std::uint8_t(code))));
      continue;
    }
    EXPECT_EQ(float_to_e4m3(e4m3_to_float(std::uint8_t(code))), code) << code;
  }
  EXPECT_EQ(e4m3_to_float(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_float(0x01), 0x1p-9f);
  EXPECT_EQ(e4m3_to_float(0x08), 0x1p-6f);
  EXPECT_EQ(float_to_e4m3(1000.0f), 0x7e);
  EXPECT_EQ(float_to_e4m3(-1000.0f), 0xfe);
  EXPECT_EQ(float_to_e4m3(1.0625f), 0x38);  // halfway between 1 and 1.125: to the even mantissa (1)
  EXPECT_EQ(float_to_e4m3(1.1875f), 0x3a);  // halfway between 1.125 and 1.25: to 1.25
  EXPECT_EQ(float_to_e4m3(0x1.8p-10f), 0x01);  // 0.75 of the subnormal unit 2^-9: one unit
  HostTensor t(DType::e4m3, {3});
  t.set(0, 3.3f);
  EXPECT_EQ(t.get(0), 3.25f);
}

}  // namespace
