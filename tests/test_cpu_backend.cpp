// The shared case table on the CPU backend.
#include "backend_suite.hpp"

namespace flashattn::testing {
namespace {

class CpuBackend : public ::testing::TestWithParam<CaseAndDtype> {};

TEST_P(CpuBackend, Forward) {
  expect_forward_ok(std::get<0>(GetParam()), std::get<1>(GetParam()), DeviceKind::cpu);
}

TEST_P(CpuBackend, Backward) {
  expect_backward_ok(std::get<0>(GetParam()), std::get<1>(GetParam()), DeviceKind::cpu);
}

INSTANTIATE_TEST_SUITE_P(Table, CpuBackend,
                         ::testing::Combine(::testing::ValuesIn(shared_cases(TableFor::cpu)),
                                            ::testing::Values(DType::f32, DType::bf16, DType::f16)),
                         case_name);

TEST(CpuBackendDeterminism, BackwardIsBitIdentical) {
  Case c;
  c.heads_q = 4;
  c.heads_kv = 1;
  c.seqlen_q = c.seqlen_k = 300;
  c.causal = true;
  EXPECT_TRUE(backward_is_reproducible(c, DType::bf16, DeviceKind::cpu, test_seed(), false));
}

}  // namespace
}  // namespace flashattn::testing
