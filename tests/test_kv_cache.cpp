// KV caches on the CPU backend: the KV-cache table (paged and contiguous caches, append +
// rotary) and paged K/V in the variable-length forward, against the float64 reference; and
// every bad-input rule of the KV-cache call (an Error naming the argument, nothing written:
// neither out nor the cache).
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>

#include "flashattn/error.hpp"
#include "flashattn/kv_cache.hpp"
#include "host_tensor.hpp"
#include "kv_suite.hpp"

namespace flashattn::testing {
namespace {

using host::HostTensor;

class CpuKvCache : public ::testing::TestWithParam<KvCaseAndDtype> {};

TEST_P(CpuKvCache, Forward) { expect_kvcache_ok(std::get<0>(GetParam()), std::get<1>(GetParam()), DeviceKind::cpu); }

INSTANTIATE_TEST_SUITE_P(Table, CpuKvCache,
                         ::testing::Combine(::testing::ValuesIn(kv_cases()),
                                            ::testing::Values(DType::f32, DType::bf16, DType::f16)),
                         kv_case_name);

TEST(CpuPagedVarlen, Forward) {
  for (int page : {16, 48, 256})
    for (bool causal : {false, true}) expect_paged_varlen_ok(page, causal, DType::bf16, DeviceKind::cpu);
}

// Pools seen through strides: each page's heads one after another, and heads padded with NaN
// columns (the CUDA table runs the same: test_cuda_kv_cache.cpp).
TEST(CpuPagedVarlen, PoolLayouts) {
  for (PoolLayout layout : {PoolLayout::heads_major, PoolLayout::padded_heads})
    for (bool causal : {false, true})
      expect_paged_varlen_ok(16, causal, DType::bf16, DeviceKind::cpu, Alibi::none, 64, false, layout);
}

// ALiBi over paged K/V with seqused_k: the bias counts from each sequence's last key in use.
TEST(CpuPagedVarlen, Alibi) {
  for (int page : {16, 48})
    for (bool causal : {false, true})
      for (Alibi alibi : {Alibi::heads, Alibi::batch_heads})
        for (DType dtype : {DType::f32, DType::bf16}) expect_paged_varlen_ok(page, causal, dtype, DeviceKind::cpu, alibi);
}

// A valid paged KV-cache call with an append (2 sequences, pages of 16, 4 pages each); each
// test breaks one thing.
struct KvCall {
  HostTensor q{DType::f16, {2, 1, 4, 32}}, kc{DType::f16, {9, 16, 2, 32}}, vc{DType::f16, {9, 16, 2, 32}};
  HostTensor kn{DType::f16, {2, 1, 2, 32}}, vn{DType::f16, {2, 1, 2, 32}};
  HostTensor cos{DType::f16, {64, 8}}, sin{DType::f16, {64, 8}};
  HostTensor table{DType::i32, {2, 4}}, seqlens{DType::i32, {2}};
  HostTensor out{DType::f16, {2, 1, 4, 32}}, lse{DType::f32, {2, 4, 1}};
  HostTensor kc0, vc0;
  KvCacheArgs args;
  KvCall() {
    std::mt19937_64 rng(3);
    for (HostTensor* t : {&q, &kc, &vc, &kn, &vn, &cos, &sin}) t->fill_normal(rng);
    auto* tb = static_cast<std::int32_t*>(table.data());
    for (int i = 0; i < 8; ++i) tb[i] = 8 - i;
    auto* sl = static_cast<std::int32_t*>(seqlens.data());
    sl[0] = 10;
    sl[1] = 63;
    out.poison();
    lse.poison();
    kc0 = kc;
    vc0 = vc;
    args.q = q.view();
    args.k_cache = kc.view();
    args.v_cache = vc.view();
    args.k_new = kn.view();
    args.v_new = vn.view();
    args.rotary_cos = cos.view();
    args.rotary_sin = sin.view();
    args.block_table = table.view();
    args.cache_seqlens = seqlens.view();
    args.out = out.view();
    args.lse = lse.view();
  }
  bool untouched() const {
    auto all_ff = [](const HostTensor& t) {
      const auto* p = static_cast<const unsigned char*>(t.data());
      for (std::size_t i = 0; i < t.storage_bytes(); ++i)
        if (p[i] != 0xff) return false;
      return true;
    };
    return all_ff(out) && all_ff(lse) && std::memcmp(kc.data(), kc0.data(), kc.storage_bytes()) == 0 &&
           std::memcmp(vc.data(), vc0.data(), vc.storage_bytes()) == 0;
  }
};

void expect_kv_error(const std::function<void(KvCall&)>& breaker, const std::string& argument,
                     const std::string& fragment, ErrorKind kind = ErrorKind::invalid_argument) {
  KvCall c;
  breaker(c);
  try {
    forward_kvcache(c.args);
    ADD_FAILURE() << "no error; expected one about " << argument;
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), argument) << e.what();
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    EXPECT_EQ(int(e.kind()), int(kind)) << e.what();
  }
  EXPECT_TRUE(c.untouched()) << "written despite the error about " << argument;
}

TEST(KvCacheValidation, ValidCallWritesOutAndCache) {
  KvCall c;
  EXPECT_NO_THROW(forward_kvcache(c.args));
  EXPECT_FALSE(c.untouched());
}

TEST(KvCacheValidation, BlockTableOutOfRange) {
  expect_kv_error([](auto& c) { static_cast<std::int32_t*>(c.table.data())[4] = 9; }, "block_table[1][0]",
                  "[0, 9)");
  expect_kv_error([](auto& c) { static_cast<std::int32_t*>(c.table.data())[0] = -1; }, "block_table[0][0]",
                  "page index");
}

TEST(KvCacheValidation, UnusedTableEntriesAreNotRead) {
  KvCall c;
  static_cast<std::int32_t*>(c.table.data())[3] = -7;  // sequence 0 (11 rows) uses one page
  EXPECT_NO_THROW(forward_kvcache(c.args));
}

TEST(KvCacheValidation, CacheTooShortForAppend) {
  // 63 rows + 1 appended fit 4 pages of 16; 64 + 1 do not.
  expect_kv_error([](auto& c) { static_cast<std::int32_t*>(c.seqlens.data())[1] = 64; }, "cache_seqlens[1]",
                  "block_table");
}

TEST(KvCacheValidation, CacheSeqlensBeyondCache) {
  expect_kv_error(
      [](auto& c) {
        c.args.k_new = c.args.v_new = {};
        c.args.rotary_cos = c.args.rotary_sin = {};
        static_cast<std::int32_t*>(c.seqlens.data())[0] = 65;
      },
      "cache_seqlens[0]", "block_table");
  expect_kv_error([](auto& c) { static_cast<std::int32_t*>(c.seqlens.data())[0] = -1; }, "cache_seqlens[0]",
                  "non-negative");
}

TEST(KvCacheValidation, ContiguousCacheTooShort) {
  HostTensor kc(DType::f16, {2, 30, 2, 32}), vc(DType::f16, {2, 30, 2, 32});
  expect_kv_error(
      [&](auto& c) {
        c.args.block_table = {};
        c.args.k_cache = kc.view();
        c.args.v_cache = vc.view();
        c.args.rotary_cos = c.args.rotary_sin = {};
        static_cast<std::int32_t*>(c.seqlens.data())[1] = 30;
      },
      "cache_seqlens[1]", "room for the 1 appended rows");
}

TEST(KvCacheValidation, PageSize) {
  HostTensor kc(DType::f16, {9, 24, 2, 32}), vc(DType::f16, {9, 24, 2, 32});
  expect_kv_error([&](auto& c) { c.args.k_cache = kc.view(), c.args.v_cache = vc.view(); },
                  "k_cache.shape[1] (page_size)", "multiple of 16");
  HostTensor big(DType::f16, {1, 528, 2, 32}), big_v(DType::f16, {1, 528, 2, 32});
  expect_kv_error([&](auto& c) { c.args.k_cache = big.view(), c.args.v_cache = big_v.view(); },
                  "k_cache.shape[1] (page_size)", "512");
}

TEST(KvCacheValidation, Dtypes) {
  HostTensor kc(DType::bf16, {9, 16, 2, 32});
  expect_kv_error([&](auto& c) { c.args.k_cache = kc.view(); }, "k_cache.dtype", "f16", ErrorKind::invalid_type);
  HostTensor kn(DType::f32, {2, 1, 2, 32});
  expect_kv_error([&](auto& c) { c.args.k_new = kn.view(); }, "k.dtype", "f16", ErrorKind::invalid_type);
  HostTensor table(DType::f32, {2, 4});
  expect_kv_error([&](auto& c) { c.args.block_table = table.view(); }, "block_table.dtype", "i32",
                  ErrorKind::invalid_type);
  HostTensor cos(DType::f32, {64, 8});
  expect_kv_error([&](auto& c) { c.args.rotary_cos = cos.view(); }, "rotary_cos.dtype", "f16",
                  ErrorKind::invalid_type);
}

TEST(KvCacheValidation, Shapes) {
  HostTensor kn(DType::f16, {2, 1, 4, 32});
  expect_kv_error([&](auto& c) { c.args.k_new = kn.view(); }, "k.shape", "heads_kv");
  expect_kv_error([](auto& c) { c.args.v_new = {}; }, "v", "both");
  expect_kv_error([](auto& c) { c.args.rotary_sin = {}; }, "rotary_sin", "both");
  HostTensor cos(DType::f16, {64, 20}), sin(DType::f16, {64, 20});
  expect_kv_error([&](auto& c) { c.args.rotary_cos = cos.view(), c.args.rotary_sin = sin.view(); },
                  "rotary_cos.shape[1] (rotary_dim / 2)", "head_dim / 2");
  HostTensor short_cos(DType::f16, {32, 8}), short_sin(DType::f16, {32, 8});
  expect_kv_error([&](auto& c) { c.args.rotary_cos = short_cos.view(), c.args.rotary_sin = short_sin.view(); },
                  "rotary_cos.shape[0] (seqlen_ro)", "64");
  HostTensor table(DType::i32, {3, 4});
  expect_kv_error([&](auto& c) { c.args.block_table = table.view(); }, "block_table.shape[0]", "batch");
  expect_kv_error([](auto& c) { c.args.k_new = c.args.v_new = {}; }, "k", "rotate");
  expect_kv_error([](auto& c) { c.args.num_splits = -1; }, "num_splits", ">= 0");
  HostTensor out(DType::f16, {2, 2, 4, 32});
  expect_kv_error([&](auto& c) { c.args.out = out.view(); }, "out.shape", "q");
}

TEST(KvCacheValidation, BatchIndexAndLeftpad) {
  HostTensor idx(DType::i32, {2});
  expect_kv_error([&](auto& c) { c.args.cache_batch_idx = idx.view(); }, "cache_batch_idx", "paged");
  HostTensor kc(DType::f16, {3, 64, 2, 32}), vc(DType::f16, {3, 64, 2, 32});
  auto contiguous = [&](KvCall& c) {
    c.args.block_table = {};
    c.args.k_cache = kc.view();
    c.args.v_cache = vc.view();
    c.args.cache_batch_idx = idx.view();
    static_cast<std::int32_t*>(idx.data())[0] = 2;
    static_cast<std::int32_t*>(idx.data())[1] = 2;
  };
  expect_kv_error(contiguous, "cache_batch_idx[1]", "distinct");
  expect_kv_error([&](auto& c) { contiguous(c), static_cast<std::int32_t*>(idx.data())[1] = 3; },
                  "cache_batch_idx[1]", "[0, 3)");
  HostTensor pad(DType::i32, {2});
  expect_kv_error(
      [&](auto& c) {
        c.args.cache_leftpad = pad.view();
        static_cast<std::int32_t*>(pad.data())[0] = 11;
        static_cast<std::int32_t*>(pad.data())[1] = 0;
      },
      "cache_leftpad[0]", "cache_seqlens[b] = 10");
}

}  // namespace
}  // namespace flashattn::testing
