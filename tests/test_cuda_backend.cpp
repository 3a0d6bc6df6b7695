// The shared case table on the CUDA backend (ctest label `gpu`; skipped without a GPU).
// FLASHATTN_CUDA_FAMILY=sm80|sm90 forces a kernel family (src/cuda/dispatch.cu).
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend_suite.hpp"
#include "flashattn/attention.hpp"

namespace flashattn::testing {
namespace {

// Whether this build instantiated a kernel for (family, direction, dtype, head dim): the
// generated list the dispatcher reads too. family nullptr: any family.
bool instance_built(const char* family, const char* direction, DType dtype, int head_dim) {
  const char* dt = dtype == DType::f16 ? "f16" : "bf16";
#define FA_INSTANCE(f, dir, d, hd)                                                            \
  if ((family == nullptr || std::strcmp(family, #f) == 0) && std::strcmp(direction, #dir) == 0 && \
      std::strcmp(dt, #d) == 0 && head_dim == hd)                                              \
    return true;
#include "flashattn_instances.inc"
#undef FA_INSTANCE
  return false;
}

// The family FLASHATTN_CUDA_FAMILY forces, read as src/cuda/dispatch.cu reads it; nullptr: none.
const char* forced_family() {
  const char* env = std::getenv("FLASHATTN_CUDA_FAMILY");
  return env && *env && std::strcmp(env, "auto") != 0 ? env : nullptr;
}

bool forward_built(int head_dim, DType dtype) {
  return instance_built(forced_family(), "forward", dtype, head_dim);
}

// A backward case runs the forward first, then the backward of the forced family (any family
// when none is forced: dispatch falls back to sm80 where sm90 has no backward).
bool backward_built(int head_dim, DType dtype) {
  return forward_built(head_dim, dtype) && instance_built(forced_family(), "backward", dtype, head_dim);
}

std::string not_built(const char* direction, int head_dim, DType dtype) {
  return std::string("this build has no ") + direction + " kernel for " + to_string(dtype) + ", head dim " +
         std::to_string(head_dim) + (forced_family() ? std::string(" in family ") + forced_family() : "");
}

// Cases without a kernel in this build (FLASHATTN_HEADDIMS, FLASHATTN_DTYPES,
// FLASHATTN_KERNEL_FAMILIES) skip; a case the build has kernels for fails if it throws.
class CudaBackend : public ::testing::TestWithParam<CaseAndDtype> {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
  const Case& test_case() const { return std::get<0>(GetParam()); }
  DType dtype() const { return std::get<1>(GetParam()); }
};

TEST_P(CudaBackend, Forward) {
  if (!forward_built(test_case().head_dim, dtype())) GTEST_SKIP() << not_built("forward", test_case().head_dim, dtype());
  expect_forward_ok(test_case(), dtype(), DeviceKind::cuda);
}

TEST_P(CudaBackend, Backward) {
  if (!backward_built(test_case().head_dim, dtype())) GTEST_SKIP() << not_built("backward", test_case().head_dim, dtype());
  expect_backward_ok(test_case(), dtype(), DeviceKind::cuda);
}

TEST_P(CudaBackend, DeterministicBackward) {
  if (!backward_built(test_case().head_dim, dtype())) GTEST_SKIP() << not_built("backward", test_case().head_dim, dtype());
  expect_backward_ok(test_case(), dtype(), DeviceKind::cuda, true);
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
    if (!backward_built(c.head_dim, DType::bf16)) GTEST_SKIP() << not_built("backward", c.head_dim, DType::bf16);
    EXPECT_TRUE(backward_is_reproducible(c, DType::bf16, DeviceKind::cuda, test_seed(), true))
        << "heads " << hq << ":" << hkv;
  }
}

// The GPU drops exactly the entries the CPU backend drops for the same seed and offset
// (src/common/philox.hpp), with and without a causal mask, over several 16 x 16 blocks of
// rows and keys, batches and query heads (GQA).
TEST(CudaDropout, DropsTheSameEntriesAsTheCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  Case c;
  c.batch = 2;
  c.heads_q = 3;
  c.heads_kv = 1;
  c.seqlen_q = 300;
  c.seqlen_k = 120;
  c.head_dim = 128;
  c.dropout_p = 0.17f;
  if (!forward_built(c.head_dim, DType::bf16)) GTEST_SKIP() << not_built("forward", c.head_dim, DType::bf16);
  for (bool causal : {false, true}) {
    c.causal = causal;
    const std::uint64_t seed = test_seed();
    const std::vector<bool> gpu = dropout_kept_entries(c, DType::bf16, DeviceKind::cuda, seed);
    const std::vector<bool> cpu = dropout_kept_entries(c, DType::bf16, DeviceKind::cpu, seed);
    std::size_t differ = 0;
    for (std::size_t e = 0; e < gpu.size(); ++e) differ += gpu[e] != cpu[e];
    EXPECT_EQ(differ, 0u) << "seed " << seed << ", causal " << causal;
  }
}

}  // namespace
}  // namespace flashattn::testing
