// The shared case table on the CUDA backend (ctest label `gpu`; skipped without a GPU).
// FLASHATTN_CUDA_FAMILY=sm80|sm90 forces a kernel family (src/cuda/dispatch.cu).
#include <algorithm>
#include <iterator>

#include "backend_suite.hpp"
#include "flashattn/attention.hpp"

namespace flashattn::testing {
namespace {

// Whether this build instantiated kernels for the case (tests/CMakeLists.txt passes the lists).
bool kernel_built(const Case& c, DType dtype) {
  constexpr int head_dims[] = {FLASHATTN_BUILT_HEAD_DIMS};
  const bool dtype_built = dtype == DType::f16 ? FLASHATTN_BUILT_F16 : FLASHATTN_BUILT_BF16;
  return dtype_built && std::find(std::begin(head_dims), std::end(head_dims), c.head_dim) != std::end(head_dims);
}

class CudaBackend : public ::testing::TestWithParam<CaseAndDtype> {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
    const auto& [c, dtype] = GetParam();
    if (!kernel_built(c, dtype))
      GTEST_SKIP() << "this build has no " << to_string(dtype) << " kernel for head dim " << c.head_dim;
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
    if (!kernel_built(c, DType::bf16)) GTEST_SKIP() << "this build has no bf16 kernel for head dim 128";
    EXPECT_TRUE(backward_is_reproducible(c, DType::bf16, DeviceKind::cuda, test_seed(), true))
        << "heads " << hq << ":" << hkv;
  }
}

}  // namespace
}  // namespace flashattn::testing
