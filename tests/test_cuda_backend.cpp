// The shared case table on the CUDA backend (ctest label `gpu`; skipped without a GPU).
// FLASHATTN_CUDA_FAMILY=sm80|sm90 forces a kernel family (src/cuda/dispatch.cu).
#include "backend_suite.hpp"
#include "flashattn/attention.hpp"

namespace flashattn::testing {
namespace {

class CudaBackend : public ::testing::TestWithParam<CaseAndDtype> {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(CudaBackend, Forward) {
  expect_forward_ok(std::get<0>(GetParam()), std::get<1>(GetParam()), DeviceKind::cuda);
}

TEST_P(CudaBackend, Backward) {
  expect_backward_ok(std::get<0>(GetParam()), std::get<1>(GetParam()), DeviceKind::cuda);
}

TEST_P(CudaBackend, DeterministicBackward) {
  expect_backward_ok(std::get<0>(GetParam()), std::get<1>(GetParam()), DeviceKind::cuda, true);
}

INSTANTIATE_TEST_SUITE_P(Table, CudaBackend,
                         ::testing::Combine(::testing::ValuesIn(shared_cases(TableFor::cuda)),
                                            ::testing::Values(DType::bf16, DType::f16)),
                         case_name);

TEST(CudaDeterminism, DeterministicBackwardIsBitIdentical) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (auto [hq, hkv] : {std::pair{8, 8}, std::pair{8, 1}}) {
    Case c;
    c.heads_q = hq;
    c.heads_kv = hkv;
    c.batch = 2;
    c.seqlen_q = c.seqlen_k = 700;
    c.head_dim = 128;
    c.causal = true;
    EXPECT_TRUE(backward_is_reproducible(c, DType::bf16, DeviceKind::cuda, test_seed(), true))
        << "heads " << hq << ":" << hkv;
  }
}

}  // namespace
}  // namespace flashattn::testing
