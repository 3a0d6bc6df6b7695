// The host-side helpers the benchmarks and the command line rely on for their inputs.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>

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

}  // namespace
