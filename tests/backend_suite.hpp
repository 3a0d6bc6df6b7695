#pragma once
// The shared suite, instantiated once per backend (test_cpu_backend.cpp, test_cuda_backend.cpp):
// every case of the table, forward and backward, against the float64 reference.
#include <gtest/gtest.h>

#include <string>
#include <tuple>

#include "flashattn/error.hpp"
#include "support/cases.hpp"
#include "support/harness.hpp"

namespace flashattn::testing {

using CaseAndDtype = std::tuple<Case, DType>;

inline std::string case_name(const ::testing::TestParamInfo<CaseAndDtype>& info) {
  return std::get<0>(info.param).name + "_" + to_string(std::get<1>(info.param));
}

inline void expect_forward_ok(const Case& c, DType dtype, DeviceKind device) {
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (FLASHATTN_TEST_SEED reproduces it)");
  const ForwardCheck r = check_forward(c, dtype, device, seed);
  SCOPED_TRACE(r.describe());
  EXPECT_TRUE(r.all_written);
  EXPECT_TRUE(r.padding_untouched);
  EXPECT_TRUE(r.masked_rows_ok);
  EXPECT_LE(r.out_error, tolerance(r.out_baseline, dtype, c));
  EXPECT_LE(r.lse_error, lse_tolerance(dtype, c));
}

inline void expect_backward_ok(const Case& c, DType dtype, DeviceKind device, bool deterministic = false) {
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (FLASHATTN_TEST_SEED reproduces it)");
  const BackwardCheck r = check_backward(c, dtype, device, seed, deterministic);
  SCOPED_TRACE(r.describe());
  EXPECT_TRUE(r.all_written);
  EXPECT_TRUE(r.padding_untouched);
  EXPECT_LE(r.dq_error, tolerance(r.dq_baseline, dtype, c));
  EXPECT_LE(r.dk_error, tolerance(r.dk_baseline, dtype, c));
  EXPECT_LE(r.dv_error, tolerance(r.dv_baseline, dtype, c));
}

}  // namespace flashattn::testing
