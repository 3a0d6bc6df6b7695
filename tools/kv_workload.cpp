#include "kv_workload.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <stdexcept>
#include <vector>

#include "device_buffer.hpp"
#include "flashattn/kv_cache.hpp"
#include "host_tensor.hpp"

namespace flashattn::tools {

using host::DeviceBuffer;
using host::HostTensor;

struct KvWorkload::State {
  Shape s;
  KvOptions kv;
  HostTensor q, k_cache, v_cache, k_new, v_new, cos, sin, table, seqlens, out, slopes;
  std::vector<DeviceBuffer> device;
  std::vector<HostTensor*> tensors() {
    return {&q, &k_cache, &v_cache, &k_new, &v_new, &cos, &sin, &table, &seqlens, &out, &slopes};
  }
  TensorView view(int i) {
    HostTensor* t = tensors()[i];
    return s.device == DeviceKind::cuda ? t->view(DeviceKind::cuda, device[i].data()) : t->view();
  }
  KvCacheArgs args(bool on_host) {
    auto v = [&](int i) { return on_host ? tensors()[i]->view() : view(i); };
    KvCacheArgs a;
    a.q = v(0);
    a.k_cache = v(1);
    a.v_cache = v(2);
    if (kv.append > 0) a.k_new = v(3), a.v_new = v(4);
    if (kv.rotary_dim > 0) a.rotary_cos = v(5), a.rotary_sin = v(6);
    if (kv.page_size > 0) a.block_table = v(7);
    a.cache_seqlens = v(8);
    a.out = v(9);
    a.causal = s.causal;
    a.window_left = s.window_left;
    a.window_right = s.window_right;
    a.softcap = s.softcap;
    if (s.alibi) a.alibi_slopes = v(10);
    return a;
  }
};

KvWorkload::KvWorkload(const Shape& s, const KvOptions& kv, std::uint64_t seed) : state_(std::make_unique<State>()) {
  State& st = *state_;
  st.s = s;
  st.kv = kv;
  const std::int64_t b = s.batch, n = s.seqlen, nk = s.keys(), h = s.heads, hk = s.kv_heads(), d = s.head_dim;
  if (kv.append > nk) throw std::invalid_argument("--append must be at most the cache's rows (--seqlen-k)");
  st.q = HostTensor(s.dtype, {b, n, h, d});
  st.out = HostTensor(s.dtype, {b, n, h, d});
  if (kv.page_size > 0) {
    const std::int64_t per_seq = (nk + kv.page_size - 1) / kv.page_size;
    st.k_cache = HostTensor(s.dtype, {b * per_seq, kv.page_size, hk, d});
    st.v_cache = HostTensor(s.dtype, {b * per_seq, kv.page_size, hk, d});
    st.table = HostTensor(DType::i32, {b, per_seq});
    std::vector<std::int32_t> pages(std::size_t(b * per_seq));
    std::iota(pages.begin(), pages.end(), 0);
    std::mt19937_64 rng(seed);
    std::shuffle(pages.begin(), pages.end(), rng);
    std::copy(pages.begin(), pages.end(), static_cast<std::int32_t*>(st.table.data()));
  } else {
    st.k_cache = HostTensor(s.dtype, {b, nk, hk, d});
    st.v_cache = HostTensor(s.dtype, {b, nk, hk, d});
    st.table = HostTensor(DType::i32, {1, 1});
  }
  st.k_new = HostTensor(s.dtype, {b, std::max(kv.append, 1), hk, d});
  st.v_new = HostTensor(s.dtype, {b, std::max(kv.append, 1), hk, d});
  const std::int64_t rotary_rows = kv.page_size > 0 ? st.table.shape()[1] * kv.page_size : nk;
  st.cos = HostTensor(s.dtype, {rotary_rows, std::max(kv.rotary_dim / 2, 1)});
  st.sin = HostTensor(s.dtype, {rotary_rows, std::max(kv.rotary_dim / 2, 1)});
  std::uint64_t stream = seed * 8;
  for (HostTensor* t : {&st.q, &st.k_cache, &st.v_cache, &st.k_new, &st.v_new}) t->fill_normal_parallel(stream++);
  std::mt19937_64 rng(seed + 1);
  std::uniform_real_distribution<float> angle(0.0f, 6.2831853f);
  for (std::int64_t i = 0; i < st.cos.numel(); ++i) {
    const float a = angle(rng);
    st.cos.set(i, std::cos(a));
    st.sin.set(i, std::sin(a));
  }
  // ALiBi (--alibi): the standard geometric slopes 2^(-8k/H), k = 1..H, as `run` takes them.
  st.slopes = HostTensor(DType::f32, {h});
  for (std::int64_t i = 0; i < h; ++i) st.slopes.set(i, float(std::exp2(-8.0 * double(i + 1) / double(h))));
  st.seqlens = HostTensor(DType::i32, {b});
  std::fill_n(static_cast<std::int32_t*>(st.seqlens.data()), b, std::int32_t(nk - kv.append));
  st.out.poison();
  if (s.device == DeviceKind::cuda)
    for (HostTensor* t : st.tensors()) st.device.push_back(DeviceBuffer::upload(*t));
}

KvWorkload::~KvWorkload() = default;

void KvWorkload::forward() { forward_kvcache(state_->args(false)); }

RowCheck KvWorkload::check() {
  State& st = *state_;
  if (st.s.device == DeviceKind::cuda) {
    host::device_synchronize();
    st.device[9].download(st.out);
  }
  // The reference on host copies: the caches as uploaded (the append rewrites the same rows
  // with the same values on every call, so they equal the state before any call).
  HostTensor got = st.out;
  HostTensor ref_out(st.s.dtype, st.out.shape());
  KvCacheArgs a = st.args(true);
  a.out = ref_out.view();
  reference::forward_kvcache(a);
  RowCheck r;
  r.tolerance = st.s.dtype == DType::f32 ? 1e-4 : st.s.dtype == DType::f16 ? 5e-3 : 2e-2;
  const std::int64_t d = st.s.head_dim, rows = got.numel() / d;
  r.rows = int(rows);
  for (std::int64_t row = 0; row < rows; ++row) {
    double diff = 0, norm = 0;
    for (std::int64_t e = 0; e < d; ++e) {
      const double x = got.get(row * d + e), y = ref_out.get(row * d + e);
      diff += (x - y) * (x - y);
      norm += y * y;
    }
    const double err = norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
    if (!(err <= r.max_error)) r.max_error = std::isnan(err) ? INFINITY : err;
  }
  return r;
}

std::size_t KvWorkload::tensor_bytes() const {
  std::size_t total = 0;
  for (HostTensor* t : state_->tensors()) total += t->storage_bytes();
  return total;
}

double KvWorkload::kv_bytes() const {
  const Shape& s = state_->s;
  return 2.0 * s.batch * s.keys() * s.kv_heads() * s.head_dim * element_size(s.dtype);
}

}  // namespace flashattn::tools
