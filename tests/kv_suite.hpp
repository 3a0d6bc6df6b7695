#pragma once
// The KV-cache table (support/kv_cases.hpp) as a parameterized suite, shared by the CPU and
// CUDA test executables.
#include <gtest/gtest.h>

#include <string>
#include <tuple>

#include "support/harness.hpp"
#include "support/kv_cases.hpp"

namespace flashattn::testing {

using KvCaseAndDtype = std::tuple<KvCase, DType>;

inline std::string kv_case_name(const ::testing::TestParamInfo<KvCaseAndDtype>& info) {
  return std::get<0>(info.param).name + "_" + to_string(std::get<1>(info.param));
}

// The tolerance of the shared table (harness.hpp) with the case's head dim.
inline double kv_tolerance(double baseline, DType dtype, int head_dim) {
  Case c;
  c.head_dim = head_dim;
  c.magnitude = 1.0f;
  return tolerance(baseline, dtype, c);
}

inline void expect_kvcache_ok(const KvCase& c, DType dtype, DeviceKind device) {
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (FLASHATTN_TEST_SEED reproduces it)");
  const KvCheck r = check_kvcache(c, dtype, device, seed);
  SCOPED_TRACE(r.describe());
  EXPECT_TRUE(r.all_written);
  EXPECT_TRUE(r.cache_ok);
  EXPECT_TRUE(r.masked_rows_ok);
  EXPECT_LE(r.out_error, kv_tolerance(r.out_baseline, dtype, c.head_dim));
  Case lc;
  lc.head_dim = c.head_dim;
  EXPECT_LE(r.lse_error, lse_tolerance(dtype, lc));
}

inline void expect_paged_varlen_ok(int page_size, bool causal, DType dtype, DeviceKind device,
                                   Alibi alibi = Alibi::none, int head_dim = 64, bool one_sm_long_queries = false,
                                   PoolLayout layout = PoolLayout::contiguous) {
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + ", page " + std::to_string(page_size) + ", d " +
               std::to_string(head_dim) + (causal ? ", causal" : "") +
               (alibi == Alibi::none ? "" : alibi == Alibi::heads ? ", alibi (heads_q,)" : ", alibi (batch, heads_q)") +
               (one_sm_long_queries ? ", one SM, long queries" : "") + ", " + to_string(layout));
  const KvCheck r =
      check_paged_varlen(page_size, causal, dtype, device, seed, alibi, head_dim, one_sm_long_queries, layout);
  SCOPED_TRACE(r.describe());
  EXPECT_TRUE(r.all_written);
  EXPECT_TRUE(r.masked_rows_ok);
  EXPECT_LE(r.out_error, kv_tolerance(r.out_baseline, dtype, 64));
  Case lc;
  EXPECT_LE(r.lse_error, lse_tolerance(dtype, lc));
}

}  // namespace flashattn::testing
