// The shared case table on the CUDA backend (ctest label `gpu`; skipped without a GPU).
// FLASHATTN_CUDA_FAMILY=sm80|sm90 forces a kernel family (src/cuda/dispatch.cu).
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include <random>

#include "backend_suite.hpp"
#include "device_buffer.hpp"
#include "flashattn/attention.hpp"
#include "flashattn/fp8.hpp"
#include "host_tensor.hpp"

namespace flashattn::testing {
namespace {

// Whether this build instantiated a kernel for (family, direction, dtype, width): the
// generated list the dispatcher reads too. family nullptr: any family.
bool instance_built(const char* family, const char* direction, DType dtype, int head_dim) {
  const char* dt = to_string(dtype);
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

// The smallest kernel width >= head_dim built for (family, direction, dtype); 0 if none. A
// head dim runs on it with the columns past it predicated off (src/cuda/common/head_columns.cuh).
int width_built(const char* family, const char* direction, DType dtype, int head_dim) {
  for (int width : {32, 64, 96, 128, 192, 256})
    if (width >= head_dim && instance_built(family, direction, dtype, width)) return width;
  return 0;
}

// Whether the sm90 family runs the head dim (src/cuda/sm90/api.hpp, src/cuda/dispatch.cu): a
// multiple of 8 (the table's layouts are then 16-byte aligned); the backward only its widths.
bool sm90_runs(const char* direction, DType dtype, int head_dim) {
  const int width = width_built("sm90", direction, dtype, head_dim);
  return width != 0 && head_dim % 8 == 0 && (std::strcmp(direction, "forward") == 0 || width == head_dim);
}

bool runs(const char* direction, DType dtype, int head_dim) {
  const char* forced = forced_family();
  if (forced && std::strcmp(forced, "sm90") == 0) return sm90_runs(direction, dtype, head_dim);
  if (forced) return width_built(forced, direction, dtype, head_dim) != 0;
  return width_built("sm80", direction, dtype, head_dim) != 0 || sm90_runs(direction, dtype, head_dim);
}

bool forward_built(int head_dim, DType dtype) { return runs("forward", dtype, head_dim); }

// A backward case runs the forward first, then the backward of the forced family (any family
// when none is forced: dispatch falls back to sm80 where sm90 has no backward).
bool backward_built(int head_dim, DType dtype) {
  return forward_built(head_dim, dtype) && runs("backward", dtype, head_dim);
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

// FP8: the table's cases that the e4m3 forward takes (fp8_cases, support/cases.hpp), with an
// f16 and a bf16 output, descale factors per (sequence, KV head), per block of Q and K rows
// (block quantization), and per tensor. The bound on every element is derived from e4m3's
// precision in support/harness.hpp (check_forward_fp8). Not the large-magnitude rows (inputs
// N(0, 30^2), logits near 1000): there the output missed that bound by 1.1-4.3x (H100,
// 2026-11-26), while the LSE stayed within 2.1e-4. Suspected, not verified: the FP8 tensor
// cores' partial sums keep fewer bits than fp32, and at logits near 1000 that moves the
// secondary keys' probabilities by more than P's rounding does.

using Fp8Param = std::tuple<Case, DType, Fp8Scales>;

bool on_hopper() {
  int device = 0, major = 0, minor = 0;
  return cudaGetDevice(&device) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
         cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess && major == 9 &&
         minor == 0;
}

class CudaFp8 : public ::testing::TestWithParam<Fp8Param> {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
    if (!on_hopper()) GTEST_SKIP() << "e4m3 runs on Hopper only";
    const char* forced = forced_family();
    if (forced && std::strcmp(forced, "sm90") != 0) GTEST_SKIP() << "e4m3 runs on the sm90 family only";
    if (width_built("sm90", "forward", DType::e4m3, std::get<0>(GetParam()).head_dim) == 0)
      GTEST_SKIP() << not_built("forward", std::get<0>(GetParam()).head_dim, DType::e4m3);
  }
};

TEST_P(CudaFp8, Forward) {
  const auto& [c, out_dtype, scales] = GetParam();
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (FLASHATTN_TEST_SEED reproduces it)");
  const Fp8ForwardCheck r = check_forward_fp8(c, out_dtype, scales, seed);
  SCOPED_TRACE(r.describe());
  EXPECT_TRUE(r.all_written);
  EXPECT_TRUE(r.masked_rows_ok);
  EXPECT_LE(r.worst_ratio, 1.0);
  EXPECT_LE(r.lse_error, lse_tolerance(DType::bf16, c));
}

INSTANTIATE_TEST_SUITE_P(Table, CudaFp8,
                         ::testing::Combine(::testing::ValuesIn(fp8_cases()), ::testing::Values(DType::bf16, DType::f16),
                                            ::testing::Values(Fp8Scales::per_head, Fp8Scales::per_block,
                                                              Fp8Scales::per_tensor)),
                         [](const ::testing::TestParamInfo<Fp8Param>& info) {
                           const Fp8Scales scales = std::get<2>(info.param);
                           return std::get<0>(info.param).name + "_e4m3_to_" + to_string(std::get<1>(info.param)) +
                                  (scales == Fp8Scales::per_head    ? "_per_head"
                                   : scales == Fp8Scales::per_block ? "_per_block"
                                                                    : "_per_tensor");
                         });

// quantize_e4m3 (flashattn/fp8.hpp): the CUDA kernels give the CPU backend's bits (test_quantize.cpp
// checks the CPU against float64), per head, per tensor and per block (two blocks, the second
// partial), with and without the transform, at a head dim of one element per lane (32), of several
// (128) and one that is no power of two (80).
TEST(CudaQuantizeE4m3, SameBitsAsTheCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(test_seed());
  constexpr int kRows = kFp8ScaleBlockRows + 77;
  for (int d : {32, 80, 128}) {
    for (int variant = 0; variant < 4; ++variant) {
      const bool per_tensor = variant == 1, per_block = variant == 3, transform = variant == 2 && (d & (d - 1)) == 0;
      host::HostTensor x(DType::bf16, {3, kRows, 8, d}), signs(DType::f32, {d});
      x.fill_normal(rng, 4.0f);
      for (int i = 0; i < d; ++i) signs.set(i, (rng() & 1) ? 1.0f : -1.0f);
      auto run = [&](DeviceKind device) {
        host::HostTensor out(DType::e4m3, x.shape()),
            descale = per_tensor  ? host::HostTensor(DType::f32, {1})
                      : per_block ? host::HostTensor(DType::f32, {3, 4, 2})
                                  : host::HostTensor(DType::f32, {3, 4});
        out.poison();
        descale.poison();
        std::vector<host::DeviceBuffer> buffers;
        auto view = [&](host::HostTensor& t) {
          if (device == DeviceKind::cpu) return t.view();
          buffers.push_back(host::DeviceBuffer::upload(t));
          return t.view(DeviceKind::cuda, buffers.back().data());
        };
        QuantizeArgs a;
        a.x = view(x);
        a.out = view(out);
        a.descale = view(descale);
        if (transform) a.signs = view(signs);
        a.heads_kv = 4;
        a.per_tensor = per_tensor;
        a.per_block = per_block;
        quantize_e4m3(a);
        if (device == DeviceKind::cuda) {
          host::device_synchronize();
          buffers[1].download(out);
          buffers[2].download(descale);
        }
        return std::make_pair(std::move(out), std::move(descale));
      };
      const auto cpu = run(DeviceKind::cpu), gpu = run(DeviceKind::cuda);
      SCOPED_TRACE("d " + std::to_string(d) + ", per tensor " + std::to_string(per_tensor) + ", per block " +
                   std::to_string(per_block) + ", transform " + std::to_string(transform));
      EXPECT_EQ(std::memcmp(cpu.second.data(), gpu.second.data(), cpu.second.storage_bytes()), 0);
      EXPECT_EQ(std::memcmp(cpu.first.data(), gpu.first.data(), cpu.first.storage_bytes()), 0);
    }
  }
}

// Causal and not, GQA, and columns (KV head, sequence) that do not fill the last group of the
// sm90 backward's interleaved claim order (backward_tile.cuh): 15 columns of 11 query blocks.
// Every built head dim: up to 128 the dQ writer warp orders the adds, at 192 and 256 the consumer
// warpgroups (and at 256 the writer warp) add in the turns that the producer's warp 2 takes and
// warp 1 passes (src/cuda/sm90/backward_dq_turns.cuh).
// At 192 and 256 also a shape of many tiles per CTA (2048 over an H100's 132 CTAs), where the roles
// of a CTA drift apart across tiles: a design of the turns that passed the shapes above hung at a
// shape like it (b = 16, 10 heads, n = 1k, d = 192; not on every run), never with at most two tiles
// per CTA (bench/results/gpu_2026-11-27_h100_sm90-backward_d192-256_dq-quarter-turns.txt).
TEST(CudaDeterminism, DeterministicBackwardIsBitIdentical) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  struct Shape {
    int batch, hq, hkv, seqlen_q, seqlen_k;
  };
  int built = 0;
  for (int head_dim : {64, 96, 128, 192, 256}) {
    if (!backward_built(head_dim, DType::bf16)) continue;
    ++built;
    for (bool causal : {true, false}) {
      std::vector<Shape> shapes = {Shape{2, 8, 8, 700, 700}, Shape{2, 8, 1, 700, 700}, Shape{3, 5, 5, 700, 900}};
      if (head_dim >= 192) shapes.push_back(Shape{16, 8, 8, 1024, 1024});
      for (Shape shape : shapes) {
        Case c;
        c.batch = shape.batch;
        c.heads_q = shape.hq;
        c.heads_kv = shape.hkv;
        c.seqlen_q = shape.seqlen_q;
        c.seqlen_k = shape.seqlen_k;
        c.head_dim = head_dim;
        c.causal = causal;
        EXPECT_TRUE(backward_is_reproducible(c, DType::bf16, DeviceKind::cuda, test_seed(), true))
            << "d " << head_dim << ", b " << c.batch << ", heads " << c.heads_q << ":" << c.heads_kv << ", seqlen "
            << c.seqlen_q << "/" << c.seqlen_k << ", causal " << causal;
      }
    }
  }
  if (built == 0) GTEST_SKIP() << "no bf16 backward in this build";
}

// The GPU drops exactly the entries the CPU backend drops for the same seed and offset
// (src/common/philox.hpp), with and without a causal mask, over several 16 x 32 blocks of
// rows and keys, batches and query heads (GQA), at every head dim this build has: keys up to
// 3 x head_dim - 5 (several of the sm90 forward's key blocks, whose keep bits are drawn while
// their S GEMM runs: the first block of a warpgroup and the later ones take different paths; at
// d = 192 and 256 every other block starts in the middle of a 32-key call), rows over several tiles (and the third warpgroup of a 192-row tile at d = 64).
TEST(CudaDropout, DropsTheSameEntriesAsTheCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  int built = 0;
  for (int head_dim : {64, 96, 128, 192, 256}) {
    if (!forward_built(head_dim, DType::bf16)) continue;
    ++built;
    for (int seqlen_k : {120, 3 * head_dim - 5}) {
      Case c;
      c.batch = 2;
      c.heads_q = 3;
      c.heads_kv = 1;
      c.seqlen_q = 300;
      c.seqlen_k = seqlen_k;
      c.head_dim = head_dim;
      c.dropout_p = 0.17f;
      for (bool causal : {false, true}) {
        c.causal = causal;
        const std::uint64_t seed = test_seed();
        const std::vector<bool> gpu = dropout_kept_entries(c, DType::bf16, DeviceKind::cuda, seed);
        const std::vector<bool> cpu = dropout_kept_entries(c, DType::bf16, DeviceKind::cpu, seed);
        std::size_t differ = 0, kept = 0, visible = 0;
        for (std::size_t e = 0; e < gpu.size(); ++e) {
          differ += gpu[e] != cpu[e];
          kept += cpu[e];
          const int j = int(e % c.seqlen_k), i = int(e / c.seqlen_k % c.seqlen_q);
          visible += !causal || j <= i + c.seqlen_k - c.seqlen_q;
        }
        EXPECT_EQ(differ, 0u) << "seed " << seed << ", d " << head_dim << ", seqlen_k " << seqlen_k << ", causal "
                              << causal;
        // About 1 - p of the visible entries (not a probe that reads nothing).
        EXPECT_NEAR(double(kept) / double(visible), 0.83, 0.03) << "d " << head_dim << ", seqlen_k " << seqlen_k;
      }
    }
  }
  if (built == 0) GTEST_SKIP() << not_built("forward", 128, DType::bf16);
}

}  // namespace
}  // namespace flashattn::testing
