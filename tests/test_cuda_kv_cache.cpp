// The KV-cache table and paged varlen on the CUDA backend (ctest label `gpu`; skipped without a
// GPU, and while the CUDA backend rejects KV-cache calls as not built).
#include <gtest/gtest.h>

#include "flashattn/attention.hpp"
#include "flashattn/error.hpp"
#include "kv_suite.hpp"

namespace flashattn::testing {
namespace {

class CudaKvCache : public ::testing::TestWithParam<KvCaseAndDtype> {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

// Runs `body`; a backend that says "not built" (ErrorKind::unsupported) skips with its message.
template <class Body>
void run_or_skip_unsupported(Body&& body) {
  try {
    body();
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::unsupported) throw;
    GTEST_SKIP() << e.what();
  }
}

TEST_P(CudaKvCache, Forward) {
  run_or_skip_unsupported([&] { expect_kvcache_ok(std::get<0>(GetParam()), std::get<1>(GetParam()), DeviceKind::cuda); });
}

INSTANTIATE_TEST_SUITE_P(Table, CudaKvCache,
                         ::testing::Combine(::testing::ValuesIn(kv_cases()), ::testing::Values(DType::bf16, DType::f16)),
                         kv_case_name);

// Per dtype and head dim, so that a build without one of them skips only its rows.
class CudaPagedVarlen : public ::testing::TestWithParam<std::tuple<DType, int>> {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

// On Hopper these run the sm90 forward's page boxes and whole-block copies (forward_paged_kv.cuh:
// pages of 16 and 48 take boxes, pages of 256 both) where it is built; FLASHATTN_CUDA_FAMILY=sm80
// or sm90 picks either family.
TEST_P(CudaPagedVarlen, Forward) {
  const auto [dtype, head_dim] = GetParam();
  run_or_skip_unsupported([&] {
    for (int page : {16, 48, 80, 112, 256})  // 80 / 112: whole blocks at head dim 256 / 192 (their key blocks)
      for (bool causal : {false, true}) expect_paged_varlen_ok(page, causal, dtype, DeviceKind::cuda, Alibi::none, head_dim);
  });
}

// Longer sequences on one SM (sm_margin): at head dim 64 they run the 192-row paged kernel (three
// consumer warpgroups), the rest as above.
TEST_P(CudaPagedVarlen, TallTiles) {
  const auto [dtype, head_dim] = GetParam();
  run_or_skip_unsupported([&] {
    for (int page : {16, 48, 256})
      for (bool causal : {false, true})
        expect_paged_varlen_ok(page, causal, dtype, DeviceKind::cuda, Alibi::none, head_dim, /*one_sm_long_queries=*/true);
  });
}

// Pools that are not flash-attn's contiguous (pages, page_size, heads_kv, d): each page's heads one
// after another (one 5-D box a page there too, page_box_maps.cuh), and heads padded with NaN
// columns (CuTe's 1 KB boxes; nothing may read the padding).
TEST_P(CudaPagedVarlen, PoolLayouts) {
  const auto [dtype, head_dim] = GetParam();
  run_or_skip_unsupported([&] {
    for (PoolLayout layout : {PoolLayout::heads_major, PoolLayout::padded_heads})
      for (int page : {16, 256})
        for (bool causal : {false, true})
          expect_paged_varlen_ok(page, causal, dtype, DeviceKind::cuda, Alibi::none, head_dim, false, layout);
  });
}

// ALiBi over paged K/V with seqused_k (the bias counts from each sequence's last key in use).
TEST_P(CudaPagedVarlen, Alibi) {
  const auto [dtype, head_dim] = GetParam();
  run_or_skip_unsupported([&] {
    for (int page : {16, 48, 256})
      for (bool causal : {false, true})
        for (Alibi alibi : {Alibi::heads, Alibi::batch_heads})
          expect_paged_varlen_ok(page, causal, dtype, DeviceKind::cuda, alibi, head_dim);
  });
}

INSTANTIATE_TEST_SUITE_P(Table, CudaPagedVarlen,
                         ::testing::Combine(::testing::Values(DType::bf16, DType::f16), ::testing::Values(64, 128, 192, 256)),
                         [](const ::testing::TestParamInfo<std::tuple<DType, int>>& info) {
                           return std::string(to_string(std::get<0>(info.param))) + "_hd" + std::to_string(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace flashattn::testing
