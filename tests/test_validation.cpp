// Every bad-input rule: the call throws flashattn::Error naming the argument, with the expected
// and given values, and writes nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>

#include "api/validate.hpp"
#include "flashattn/attention.hpp"
#include "flashattn/error.hpp"
#include "flashattn/kv_cache.hpp"
#include "host_tensor.hpp"

namespace flashattn {
namespace {

using host::HostTensor;

// A valid forward call on small CPU tensors; each test breaks one thing.
struct ForwardCall {
  HostTensor q{DType::f32, {2, 5, 4, 8}}, k{DType::f32, {2, 7, 2, 8}}, v{DType::f32, {2, 7, 2, 8}};
  HostTensor out{DType::f32, {2, 5, 4, 8}}, lse{DType::f32, {2, 4, 5}};
  ForwardArgs args;
  ForwardCall() {
    std::mt19937_64 rng(1);
    for (HostTensor* t : {&q, &k, &v}) t->fill_normal(rng);
    out.poison();
    lse.poison();
    args.q = q.view();
    args.k = k.view();
    args.v = v.view();
    args.out = out.view();
    args.lse = lse.view();
  }
  bool outputs_untouched() const {
    auto all_ff = [](const HostTensor& t) {
      const auto* p = static_cast<const unsigned char*>(t.data());
      for (std::size_t i = 0; i < t.storage_bytes(); ++i)
        if (p[i] != 0xff) return false;
      return true;
    };
    return all_ff(out) && all_ff(lse);
  }
};

// Runs `call`, expecting an Error about `argument` whose message mentions `fragment`.
void expect_error(const std::function<void()>& call, const std::string& argument, const std::string& fragment,
                  ErrorKind kind = ErrorKind::invalid_argument) {
  try {
    call();
    ADD_FAILURE() << "no error; expected one about " << argument;
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), argument) << e.what();
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    EXPECT_EQ(int(e.kind()), int(kind)) << e.what();
    EXPECT_NE(std::string(e.what()).find("expected"), std::string::npos);
  }
}

void expect_forward_error(const std::function<void(ForwardCall&)>& breaker, const std::string& argument,
                          const std::string& fragment, ErrorKind kind = ErrorKind::invalid_argument) {
  ForwardCall c;
  breaker(c);
  expect_error([&] { forward(c.args); }, argument, fragment, kind);
  EXPECT_TRUE(c.outputs_untouched()) << "outputs written despite the error about " << argument;
}

TEST(Validation, ValidCallSucceeds) {
  ForwardCall c;
  EXPECT_NO_THROW(forward(c.args));
  EXPECT_FALSE(c.outputs_untouched());
}

TEST(Validation, MissingTensors) {
  expect_forward_error([](auto& c) { c.args.q = {}; }, "q", "a tensor");
  expect_forward_error([](auto& c) { c.args.k = {}; }, "k", "a tensor");
  expect_forward_error([](auto& c) { c.args.v = {}; }, "v", "a tensor");
  expect_forward_error([](auto& c) { c.args.out = {}; }, "out", "a tensor");
}

TEST(Validation, Rank) {
  expect_forward_error([](auto& c) { c.args.q.rank = 3; }, "q", "4 dimensions");
}

TEST(Validation, NegativeSizes) {
  expect_forward_error([](auto& c) { c.args.k.shape[1] = -1; }, "k.shape", "non-negative");
}

TEST(Validation, NegativeStride) {
  expect_forward_error([](auto& c) { c.args.q.stride[1] = -32; }, "q.stride[1]", "non-negative");
}

TEST(Validation, LastDimensionMustBeContiguous) {
  expect_forward_error([](auto& c) { c.args.q.stride[3] = 2; }, "q.stride[3]", "contiguous");
}

TEST(Validation, NullPointer) {
  expect_forward_error([](auto& c) { c.args.v.data = nullptr; }, "v.data", "non-null");
}

TEST(Validation, MisalignedPointer) {
  expect_forward_error([](auto& c) { c.args.q.data = static_cast<char*>(c.args.q.data) + 1; }, "q.data",
                       "aligned");
}

TEST(Validation, Dtypes) {
  expect_forward_error([](auto& c) { c.args.k.dtype = DType::f16; }, "k.dtype", "f32", ErrorKind::invalid_type);
  expect_forward_error([](auto& c) { c.args.out.dtype = DType::bf16; }, "out.dtype", "f32", ErrorKind::invalid_type);
  expect_forward_error([](auto& c) { c.args.lse.dtype = DType::f16; }, "lse.dtype", "f32", ErrorKind::invalid_type);
  expect_forward_error(
      [](auto& c) {
        c.args.q.dtype = c.args.k.dtype = c.args.v.dtype = c.args.out.dtype = DType::i32;
      },
      "q.dtype", "f32, f16 or bf16", ErrorKind::invalid_type);
  expect_forward_error(
      [](auto& c) {
        c.args.q.dtype = c.args.k.dtype = c.args.v.dtype = c.args.out.dtype = DType::e4m3;
      },
      "q.dtype", "f32, f16 or bf16", ErrorKind::unsupported);
}

// e4m3 inputs (the FP8 forward): where they run and what goes with them. Views on the CUDA
// device are validated only (make_forward_problem), never read.
TEST(Validation, Fp8Inputs) {
  auto e4m3_inputs = [](ForwardCall& c, DeviceKind device) {
    for (TensorView* t : {&c.args.q, &c.args.k, &c.args.v}) {
      t->dtype = DType::e4m3;
      t->device = device;
    }
    c.args.out.dtype = DType::bf16;
    c.args.out.device = c.args.lse.device = device;
  };
  expect_forward_error([&](auto& c) { e4m3_inputs(c, DeviceKind::cpu); }, "q.dtype", "e4m3 runs on the CUDA backend",
                       ErrorKind::unsupported);
  expect_forward_error([](auto& c) { c.args.q_descale = c.args.lse; }, "q_descale", "go with e4m3 inputs");
  HostTensor descale{DType::f32, {2, 2}}, one{DType::f32, {1}}, wrong{DType::f32, {2, 4}};
  HostTensor blocks{DType::f32, {2, 2, 1}}, too_many_blocks{DType::f32, {2, 2, 2}};  // seqlens 5 and 7: one block
  {
    ForwardCall c;
    e4m3_inputs(c, DeviceKind::cpu);
    BackwardArgs a;
    a.q = c.args.q;
    a.k = c.args.k;
    a.v = c.args.v;
    a.out = a.dout = a.dq = c.args.q;
    a.dk = a.dv = c.args.k;
    a.lse = c.args.lse;
    expect_error([&] { backward(a); }, "q.dtype", "only in the forward", ErrorKind::unsupported);
  }
  {  // the KV-cache call and paged K/V address K/V row by row, which the FP8 forward does not
    ForwardCall c;
    e4m3_inputs(c, DeviceKind::cpu);
    KvCacheArgs kv;
    kv.q = c.args.q;
    kv.k_cache = c.args.k;
    kv.v_cache = c.args.v;
    kv.out = c.args.out;
    expect_error([&] { forward_kvcache(kv); }, "q.dtype", "KV-cache call", ErrorKind::unsupported);
    HostTensor cu{DType::i32, {3}}, table{DType::i32, {2, 1}};
    ForwardArgs paged = c.args;
    paged.cu_seqlens_q = paged.cu_seqlens_k = cu.view();
    paged.block_table = table.view();
    expect_error([&] { forward(paged); }, "q.dtype", "paged K/V", ErrorKind::unsupported);
  }
#ifdef FLASHATTN_WITH_CUDA
  auto expect_cuda_error = [&](const std::function<void(ForwardCall&)>& breaker, const std::string& argument,
                               const std::string& fragment, ErrorKind kind = ErrorKind::invalid_argument) {
    ForwardCall c;
    e4m3_inputs(c, DeviceKind::cuda);
    breaker(c);
    expect_error([&] { detail::make_forward_problem(c.args); }, argument, fragment, kind);
  };
  auto accepted = [&](HostTensor& q_descale, HostTensor& k_descale) {
    ForwardCall c;
    e4m3_inputs(c, DeviceKind::cuda);
    c.args.q_descale = q_descale.view(DeviceKind::cuda);
    c.args.k_descale = k_descale.view(DeviceKind::cuda);
    return detail::make_forward_problem(c.args);
  };
  {
    const detail::ForwardProblem p = accepted(descale, one);
    EXPECT_EQ(p.out_dtype, DType::bf16);
    EXPECT_EQ(p.q_descale.batch_stride, 2);
    EXPECT_EQ(p.k_descale.batch_stride, 0);
    EXPECT_EQ(p.v_descale.data, nullptr);
    EXPECT_FALSE(p.q_descale.blocked());
  }
  {  // block quantization: (batch, heads_kv, blocks of kFp8ScaleBlockRows rows) for q and k
    const detail::ForwardProblem p = accepted(blocks, blocks);
    EXPECT_TRUE(p.q_descale.blocked());
    EXPECT_EQ(p.k_descale.blocks, 1);
  }
  expect_cuda_error([](auto& c) { c.args.out.dtype = DType::f32; }, "out.dtype", "f16 or bf16", ErrorKind::invalid_type);
  expect_cuda_error([](auto& c) { c.args.dropout_p = 0.1f; }, "dropout_p", "no dropout", ErrorKind::unsupported);
  expect_cuda_error([&](auto& c) { c.args.alibi_slopes = one.view(DeviceKind::cuda); }, "alibi_slopes", "no ALiBi",
                    ErrorKind::unsupported);
  expect_cuda_error([&](auto& c) { c.args.v_descale = wrong.view(DeviceKind::cuda); }, "v_descale.shape",
                    "(batch, heads_kv) = [2, 2]");
  expect_cuda_error([&](auto& c) { c.args.k_descale = descale.view(); }, "k_descale.device", "the device of q",
                    ErrorKind::invalid_type);
  expect_cuda_error([&](auto& c) { c.args.k_descale = too_many_blocks.view(DeviceKind::cuda); }, "k_descale.shape",
                    "(batch, heads_kv, blocks of 128 rows) = [2, 2, 1]");
  expect_cuda_error([&](auto& c) { c.args.v_descale = blocks.view(DeviceKind::cuda); }, "v_descale",
                    "V's factor scales the output once");
#endif
}

TEST(Validation, DevicesMustMatch) {
  expect_forward_error(
      [](auto& c) {
        c.args.k.device = DeviceKind::cuda;
      },
      "k.device", "the device of q", ErrorKind::invalid_type);
  expect_forward_error([](auto& c) { c.args.lse.device_index = 1; }, "lse.device", "the device of q",
                       ErrorKind::invalid_type);
}

TEST(Validation, Shapes) {
  expect_forward_error([](auto& c) { c.args.k.shape[3] = 4; }, "k.shape[3] (head_dim)", "head_dim of q (8)");
  expect_forward_error([](auto& c) { c.args.v.shape[3] = 16; }, "v.shape[3] (head_dim)", "head_dim of q (8)");
  expect_forward_error([](auto& c) { c.args.v.shape[2] = 1; }, "v.shape[2] (heads_kv)", "heads of k (2)");
  expect_forward_error([](auto& c) { c.args.k.shape[0] = 1; }, "k.shape[0] (batch)", "batch of q (2)");
  expect_forward_error([](auto& c) { c.args.v.shape[1] = 6; }, "v.shape[1] (seqlen_k)", "seqlen of k (7)");
  expect_forward_error([](auto& c) { c.args.out.shape[1] = 4; }, "out.shape", "shape of q");
  expect_forward_error([](auto& c) { c.args.lse.shape[2] = 4; }, "lse.shape", "(batch, heads_q, seqlen_q)");
}

TEST(Validation, HeadsMustDivide) {
  expect_forward_error(
      [](auto& c) {
        c.args.k.shape[2] = c.args.v.shape[2] = 3;
      },
      "q.shape[2] (heads_q)", "multiple of heads_kv (3)");
  expect_forward_error(
      [](auto& c) {
        c.args.k.shape[2] = c.args.v.shape[2] = 0;
      },
      "k.shape[2] (heads_kv)", "at least 1");
}

TEST(Validation, HeadDimRange) {
  expect_forward_error(
      [](auto& c) {
        for (TensorView* t : {&c.args.q, &c.args.k, &c.args.v, &c.args.out}) t->shape[3] = 0;
      },
      "q.shape[3] (head_dim)", "1 to 1024");
  // Strides stay valid for the larger (unsupported) head dim: no data is touched.
  expect_forward_error(
      [](auto& c) {
        for (TensorView* t : {&c.args.q, &c.args.k, &c.args.v, &c.args.out}) t->shape[3] = 2048;
      },
      "q.shape[3] (head_dim)", "1 to 1024", ErrorKind::unsupported);
}

TEST(Validation, Options) {
  expect_forward_error([](auto& c) { c.args.softmax_scale = std::nanf(""); }, "softmax_scale", "finite");
  expect_forward_error([](auto& c) { c.args.softcap = -1; }, "softcap", ">= 0");
  expect_forward_error([](auto& c) { c.args.window_left = -2; }, "window_left", ">= -1");
  expect_forward_error([](auto& c) { c.args.sm_margin = -1; }, "sm_margin", ">= 0");
  expect_forward_error([](auto& c) { c.args.window_right = -5; }, "window_right", ">= -1");
}

// flash-attn's window rules (flash_api.cpp): causal sets window_right to 0 whatever is given;
// a window >= seqlen_k (max_seqlen_k under variable length) is unbounded.
TEST(Validation, FlashAttnWindowRules) {
  ForwardCall c;  // seqlen_q 5, seqlen_k 7
  c.args.causal = true;
  c.args.window_right = 3;
  detail::ForwardProblem p = detail::make_forward_problem(c.args);
  EXPECT_EQ(p.window_right, 0);
  EXPECT_EQ(p.window_left, -1);
  EXPECT_TRUE(p.causal);
  c.args.window_left = 2;  // causal with a left window: local, right bound 0
  p = detail::make_forward_problem(c.args);
  EXPECT_EQ(p.window_left, 2);
  EXPECT_EQ(p.window_right, 0);
  EXPECT_FALSE(p.causal);
  c.args.window_left = 7;  // >= seqlen_k: unbounded
  p = detail::make_forward_problem(c.args);
  EXPECT_EQ(p.window_left, -1);
  EXPECT_TRUE(p.causal);
  c.args.causal = false;
  c.args.window_left = 6;  // < seqlen_k: kept
  c.args.window_right = 7;  // >= seqlen_k: unbounded
  p = detail::make_forward_problem(c.args);
  EXPECT_EQ(p.window_left, 6);
  EXPECT_EQ(p.window_right, -1);
  // seqlen_q > seqlen_k: a right window of seqlen_k would cut the first rows, but flash-attn
  // calls it unbounded, and so do we.
  ForwardCall tall;
  tall.args.q.shape[1] = tall.args.out.shape[1] = 3;  // seqlen_q 3 < 5 rows stored: still valid
  tall.args.k.shape[1] = tall.args.v.shape[1] = 2;    // seqlen_k 2
  tall.args.lse.shape[2] = 3;
  tall.args.window_right = 2;
  EXPECT_EQ(detail::make_forward_problem(tall.args).window_right, -1);
  tall.args.window_right = 1;
  EXPECT_EQ(detail::make_forward_problem(tall.args).window_right, 1);
}

// ALiBi slopes: float32, (heads_q,) or (batch, heads_q), last dimension contiguous, finite.
TEST(Validation, AlibiSlopes) {
  HostTensor heads(DType::f32, {4}), batch_heads(DType::f32, {2, 4});
  for (HostTensor* t : {&heads, &batch_heads})
    for (std::int64_t i = 0; i < t->numel(); ++i) t->set(i, 0.5f);
  for (HostTensor* t : {&heads, &batch_heads}) {  // valid shapes run
    ForwardCall c;
    c.args.alibi_slopes = t->view();
    EXPECT_NO_THROW(forward(c.args));
  }
  HostTensor f16(DType::f16, {4}), wrong(DType::f32, {3}), wrong_batch(DType::f32, {3, 4}),
      rank3(DType::f32, {1, 2, 4}), strided(DType::f32, {2, 4}, {8, 2}, 16), nan(DType::f32, {2, 4});
  for (std::int64_t i = 0; i < nan.numel(); ++i) nan.set(i, i == 5 ? std::nanf("") : 0.5f);
  expect_forward_error([&](auto& c) { c.args.alibi_slopes = f16.view(); }, "alibi_slopes.dtype", "f32",
                       ErrorKind::invalid_type);
  expect_forward_error([&](auto& c) { c.args.alibi_slopes = wrong.view(); }, "alibi_slopes.shape",
                       "(heads_q,) = [4]");
  expect_forward_error([&](auto& c) { c.args.alibi_slopes = wrong_batch.view(); }, "alibi_slopes.shape",
                       "(batch, heads_q) = [2, 4]");
  expect_forward_error([&](auto& c) { c.args.alibi_slopes = rank3.view(); }, "alibi_slopes", "(heads_q,)");
  expect_forward_error([&](auto& c) { c.args.alibi_slopes = strided.view(); }, "alibi_slopes.stride[1]",
                       "contiguous");
  expect_forward_error([&](auto& c) { c.args.alibi_slopes = nan.view(); }, "alibi_slopes[1, 1]", "finite");
  expect_forward_error(
      [&](auto& c) {
        c.args.alibi_slopes = heads.view();
        c.args.softmax_scale = 0.0f;
      },
      "softmax_scale", "non-zero");
}

// Variable length: offsets and maxima.
struct VarlenCall {
  HostTensor q{DType::f32, {10, 2, 8}}, k{DType::f32, {12, 2, 8}}, v{DType::f32, {12, 2, 8}};
  HostTensor out{DType::f32, {10, 2, 8}};
  HostTensor cu_q{DType::i32, {3}}, cu_k{DType::i32, {3}};
  ForwardArgs args;
  VarlenCall() {
    std::mt19937_64 rng(2);
    for (HostTensor* t : {&q, &k, &v}) t->fill_normal(rng);
    out.poison();
    set(cu_q, {0, 4, 10});
    set(cu_k, {0, 7, 12});
    args.q = q.view();
    args.k = k.view();
    args.v = v.view();
    args.out = out.view();
    args.cu_seqlens_q = cu_q.view();
    args.cu_seqlens_k = cu_k.view();
    args.max_seqlen_q = 6;
    args.max_seqlen_k = 7;
  }
  static void set(HostTensor& t, std::initializer_list<int> values) {
    int i = 0;
    for (int x : values) static_cast<std::int32_t*>(t.data())[i++] = x;
  }
};

void expect_varlen_error(const std::function<void(VarlenCall&)>& breaker, const std::string& argument,
                         const std::string& fragment, ErrorKind kind = ErrorKind::invalid_argument) {
  VarlenCall c;
  breaker(c);
  expect_error([&] { forward(c.args); }, argument, fragment, kind);
  const auto* p = static_cast<const unsigned char*>(c.out.data());
  for (std::size_t i = 0; i < c.out.storage_bytes(); ++i) ASSERT_EQ(p[i], 0xff) << "out written";
}

TEST(Validation, VarlenValidCallSucceeds) {
  VarlenCall c;
  EXPECT_NO_THROW(forward(c.args));
}

TEST(Validation, Varlen) {
  expect_varlen_error([](auto& c) { c.args.cu_seqlens_k = {}; }, "cu_seqlens_k", "both given");
  expect_varlen_error([](auto& c) { VarlenCall::set(c.cu_q, {1, 4, 10}); }, "cu_seqlens_q[0]", "0");
  expect_varlen_error([](auto& c) { VarlenCall::set(c.cu_q, {0, 5, 4}); }, "cu_seqlens_q[2]", "non-decreasing");
  expect_varlen_error([](auto& c) { VarlenCall::set(c.cu_k, {0, 7, 13}); }, "cu_seqlens_k[2]",
                      "within the packed tensor (<= 12)");
  expect_varlen_error([](auto& c) { c.args.max_seqlen_q = 5; }, "max_seqlen_q", "sequence 1 has 6");
  expect_varlen_error([](auto& c) { c.args.max_seqlen_k = -1; }, "max_seqlen_k", "non-negative");
  expect_varlen_error([](auto& c) { c.args.cu_seqlens_q.dtype = DType::f32; }, "cu_seqlens_q.dtype", "i32",
                      ErrorKind::invalid_type);
  expect_varlen_error([](auto& c) { c.args.cu_seqlens_k.shape[0] = 2; }, "cu_seqlens_k.shape",
                      "length of cu_seqlens_q (3)");
  expect_varlen_error([](auto& c) { c.args.q.rank = 4; }, "q", "3 dimensions");
}

TEST(Validation, BackwardNeedsLse) {
  HostTensor q{DType::f32, {1, 3, 1, 8}}, dq{DType::f32, {1, 3, 1, 8}};
  dq.poison();
  BackwardArgs a;
  a.q = a.k = a.v = a.out = a.dout = q.view();
  a.dq = a.dk = a.dv = dq.view();
  expect_error([&] { backward(a); }, "lse", "required");
  HostTensor lse{DType::f32, {1, 1, 3}};
  a.lse = lse.view();
  a.dk.shape[1] = 2;
  expect_error([&] { backward(a); }, "dk.shape", "shape of k");
  const auto* p = static_cast<const unsigned char*>(dq.data());
  for (std::size_t i = 0; i < dq.storage_bytes(); ++i) ASSERT_EQ(p[i], 0xff);
}

TEST(Validation, EmptyProblemsAreNoOps) {
  HostTensor q{DType::f32, {2, 0, 4, 8}}, k{DType::f32, {2, 7, 2, 8}};
  std::mt19937_64 rng(3);
  k.fill_normal(rng);
  ForwardArgs a;
  a.q = a.out = q.view();
  a.k = a.v = k.view();
  EXPECT_NO_THROW(forward(a));
}

TEST(Validation, ErrorMessageNamesEverything) {
  const Error e(ErrorKind::invalid_argument, "k.shape[3] (head_dim)", "the head_dim of q (64)", "32");
  EXPECT_STREQ(e.what(), "flashattn: k.shape[3] (head_dim): expected the head_dim of q (64), got 32");
}

#ifdef FLASHATTN_WITH_CUDA
// The GPU kernels take every head dim up to 256 (the CPU backend up to 1024). Checked before
// anything touches a device, so host memory labelled cuda serves (and must stay untouched).
TEST(Validation, GpuHeadDimAbove256) {
  expect_forward_error(
      [](auto& c) {
        for (TensorView* t : {&c.args.q, &c.args.k, &c.args.v, &c.args.out, &c.args.lse}) t->device = DeviceKind::cuda;
        for (TensorView* t : {&c.args.q, &c.args.k, &c.args.v, &c.args.out}) t->shape[3] = 257;
      },
      "q.shape[3] (head_dim)", "1 to 256 on the CUDA backend", ErrorKind::unsupported);
}
#endif

#ifndef FLASHATTN_WITH_CUDA
TEST(Validation, CudaTensorsWithoutCudaBuild) {
  expect_forward_error(
      [](auto& c) {
        for (TensorView* t : {&c.args.q, &c.args.k, &c.args.v, &c.args.out, &c.args.lse}) t->device = DeviceKind::cuda;
      },
      "q.device", "no CUDA backend", ErrorKind::unsupported);
}
#endif

}  // namespace
}  // namespace flashattn
