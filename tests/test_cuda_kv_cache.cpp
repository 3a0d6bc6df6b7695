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

TEST(CudaPagedVarlen, Forward) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  run_or_skip_unsupported([&] {
    for (int page : {16, 48, 256})
      for (bool causal : {false, true}) expect_paged_varlen_ok(page, causal, DType::bf16, DeviceKind::cuda);
  });
}

// ALiBi over paged K/V with seqused_k (the bias counts from each sequence's last key in use).
TEST(CudaPagedVarlen, Alibi) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  run_or_skip_unsupported([&] {
    for (int page : {16, 48, 256})
      for (bool causal : {false, true})
        for (Alibi alibi : {Alibi::heads, Alibi::batch_heads})
          for (DType dtype : {DType::bf16, DType::f16}) expect_paged_varlen_ok(page, causal, dtype, DeviceKind::cuda, alibi);
  });
}

}  // namespace
}  // namespace flashattn::testing
