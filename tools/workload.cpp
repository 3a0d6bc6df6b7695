#include "workload.hpp"

#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>
#include <vector>

#include "common/mask.hpp"
#include "common/philox.hpp"
#include "device_buffer.hpp"
#include "flashattn/reference.hpp"
#include "host_tensor.hpp"

namespace flashattn::tools {

using host::DeviceBuffer;
using host::HostTensor;

std::string Shape::describe() const {
  std::ostringstream s;
  s << "b=" << batch << " h=" << heads << "/" << kv_heads() << " n=" << seqlen;
  if (keys() != seqlen) s << " nk=" << keys();
  s << " d=" << head_dim << " " << to_string(dtype) << (causal ? " causal" : "");
  if (window_left >= 0 || window_right >= 0) s << " window=" << window_left << "," << window_right;
  if (softcap > 0) s << " softcap=" << softcap;
  if (dropout > 0) s << " dropout=" << dropout;
  if (alibi) s << " alibi";
  if (deterministic) s << " deterministic";
  if (fp8_blocks) s << " fp8-blocks";
  return s.str();
}

double forward_flops(const Shape& s) {
  // Visible (query, key) pairs summed over rows, from the same mask rule as the kernels.
  const detail::Window w = detail::normalized_window(s.causal, s.window_left, s.window_right, s.seqlen, s.keys());
  double pairs = 0;
  for (int i = 0; i < s.seqlen; ++i) {
    const auto r = detail::visible_keys(i, s.seqlen, s.keys(), w.left, w.right);
    pairs += std::max(0, r.end - r.begin);
  }
  // The papers count causal square attention as exactly half of the full matrix.
  if (s.causal && w.left < 0 && s.seqlen == s.keys()) pairs = 0.5 * double(s.seqlen) * s.keys();
  return 4.0 * s.batch * s.heads * pairs * s.head_dim;
}

struct Workload::State {
  Shape shape;
  HostTensor q, k, v, dout, out, lse, dq, dk, dv, slopes, q_descale, k_descale;
  std::vector<DeviceBuffer> device;  // CUDA copies, in the order of tensors()
  std::uint64_t seed;

  std::vector<HostTensor*> tensors() {
    return {&q, &k, &v, &dout, &out, &lse, &dq, &dk, &dv, &slopes, &q_descale, &k_descale};
  }
  TensorView view(int i) {
    HostTensor* t = tensors()[i];
    return shape.device == DeviceKind::cuda ? t->view(DeviceKind::cuda, device[i].data()) : t->view();
  }
  void options(AttentionOptions& o) {
    if (shape.alibi) o.alibi_slopes = view(9);
    o.causal = shape.causal;
    o.window_left = shape.window_left;
    o.window_right = shape.window_right;
    o.softcap = shape.softcap;
    o.dropout_p = shape.dropout;
    o.dropout_seed = seed;
    o.dropout_offset = 0;
  }
};

Workload::Workload(const Shape& s, std::uint64_t seed) : state_(std::make_unique<State>()) {
  State& st = *state_;
  st.shape = s;
  st.seed = seed;
  const std::int64_t b = s.batch, n = s.seqlen, nk = s.keys(), h = s.heads, hk = s.kv_heads(), d = s.head_dim;
  // e4m3 inputs (their values the standard normal draws rounded to e4m3, descale 1) give a bf16
  // output; the gradients' tensors, which the FP8 forward never uses, take the same type.
  const DType out_dtype = s.dtype == DType::e4m3 ? DType::bf16 : s.dtype;
  st.q = HostTensor(s.dtype, {b, n, h, d});
  st.k = HostTensor(s.dtype, {b, nk, hk, d});
  st.v = HostTensor(s.dtype, {b, nk, hk, d});
  st.dout = HostTensor(out_dtype, {b, n, h, d});
  st.out = HostTensor(out_dtype, {b, n, h, d});
  st.lse = HostTensor(DType::f32, {b, h, n});
  st.dq = HostTensor(out_dtype, {b, n, h, d});
  st.dk = HostTensor(out_dtype, {b, nk, hk, d});
  st.dv = HostTensor(out_dtype, {b, nk, hk, d});
  st.slopes = HostTensor(DType::f32, {h});
  // Block quantization's factors, all 1 (the inputs are the draws rounded to e4m3): what the
  // blocked path costs, with the same values as without factors.
  st.q_descale = HostTensor(DType::f32, {b, hk, s.fp8_blocks ? fp8_scale_blocks(n) : 1});
  st.k_descale = HostTensor(DType::f32, {b, hk, s.fp8_blocks ? fp8_scale_blocks(nk) : 1});
  for (HostTensor* t : {&st.q_descale, &st.k_descale})
    for (std::int64_t i = 0; i < t->numel(); ++i) t->set(i, 1.0f);
  for (std::int64_t i = 0; i < h; ++i) st.slopes.set(i, float(std::exp2(-8.0 * double(i + 1) / double(h))));
  std::uint64_t stream = seed * 4;
  for (HostTensor* t : {&st.q, &st.k, &st.v, &st.dout}) t->fill_normal_parallel(stream++);
  for (HostTensor* t : {&st.out, &st.lse, &st.dq, &st.dk, &st.dv}) t->poison();
  if (s.device == DeviceKind::cuda)
    for (HostTensor* t : st.tensors()) st.device.push_back(DeviceBuffer::upload(*t));
}

Workload::~Workload() = default;

void Workload::forward() {
  State& st = *state_;
  ForwardArgs a;
  st.options(a);
  a.q = st.view(0);
  a.k = st.view(1);
  a.v = st.view(2);
  a.out = st.view(4);
  a.lse = st.view(5);
  if (st.shape.fp8_blocks) {
    a.q_descale = st.view(10);
    a.k_descale = st.view(11);
  }
  flashattn::forward(a);
}

void Workload::backward() {
  State& st = *state_;
  BackwardArgs a;
  st.options(a);
  a.q = st.view(0);
  a.k = st.view(1);
  a.v = st.view(2);
  a.dout = st.view(3);
  a.out = st.view(4);
  a.lse = st.view(5);
  a.dq = st.view(6);
  a.dk = st.view(7);
  a.dv = st.view(8);
  a.deterministic = st.shape.deterministic;
  flashattn::backward(a);
}

void Workload::synchronize() {
  if (state_->shape.device == DeviceKind::cuda) host::device_synchronize();
}

std::size_t Workload::tensor_bytes() const {
  std::size_t total = 0;
  for (HostTensor* t : state_->tensors()) total += t->storage_bytes();
  return total;
}

RowCheck Workload::check_forward_rows(int rows) {
  State& st = *state_;
  const Shape& s = st.shape;
  if (s.device == DeviceKind::cuda) {
    host::device_synchronize();
    st.device[4].download(st.out);
  }
  // Each sampled row is its own one-query reference problem over exactly the keys it sees, so
  // the check costs O(rows * n_k * d) however long the sequence is: only those elements are
  // converted to f32 (not whole tensors, gigabytes for a long KV cache).
  const std::int64_t d = s.head_dim, hk = s.kv_heads();
  auto gather = [](const HostTensor& t, std::int64_t first, std::int64_t count, std::int64_t stride,
                   std::int64_t width) {
    std::vector<float> v(std::size_t(count * width));
    for (std::int64_t r = 0; r < count; ++r)
      for (std::int64_t e = 0; e < width; ++e) v[std::size_t(r * width + e)] = float(t.get(first + r * stride + e));
    return v;
  };
  std::mt19937_64 rng(st.seed ^ 0x9e3779b97f4a7c15ull);
  RowCheck result;
  // e4m3: P rounded to 3 mantissa bits is off by up to 2^-4 per entry (the exact bound per element
  // is in tests/support/harness.hpp); a row's norm, by less.
  result.tolerance = s.dtype == DType::f32 ? 1e-4 : s.dtype == DType::f16 ? 5e-3 : s.dtype == DType::e4m3 ? 6.25e-2 : 2e-2;
  const detail::Window w = detail::normalized_window(s.causal, s.window_left, s.window_right, s.seqlen, s.keys());
  for (int r = 0; r < rows && s.seqlen > 0 && s.batch > 0; ++r) {
    const int b = int(rng() % s.batch), h = int(rng() % s.heads), i = int(rng() % s.seqlen);
    const int hkv = h / (s.heads / s.kv_heads());
    const auto range = detail::visible_keys(i, s.seqlen, s.keys(), w.left, w.right);
    const std::int64_t row = ((std::int64_t(b) * s.seqlen + i) * s.heads + h) * d;
    std::vector<float> expected(d, 0.0f);
    if (range.end > range.begin && s.dropout > 0) {
      // Dropout: the row's softmax in double, the stream's mask (common/philox.hpp) on it.
      const std::int64_t keys = range.end - range.begin;
      const std::int64_t k_offset = ((std::int64_t(b) * s.keys() + range.begin) * hk + hkv) * d;
      std::vector<float> q1 = gather(st.q, row, 1, d, d), k1 = gather(st.k, k_offset, keys, hk * d, d),
                         v1 = gather(st.v, k_offset, keys, hk * d, d);
      std::vector<double> score(keys);
      double max_score = -INFINITY, sum = 0;
      for (std::int64_t j = 0; j < keys; ++j) {
        double dot = 0;
        for (std::int64_t e = 0; e < d; ++e) dot += double(q1[e]) * k1[j * d + e];
        double x = dot / std::sqrt(double(d));
        if (s.softcap > 0) x = s.softcap * std::tanh(x / s.softcap);
        score[j] = x;
        max_score = std::max(max_score, x);
      }
      for (double& x : score) sum += x = std::exp(x - max_score);
      const std::uint32_t threshold = detail::dropout_threshold(s.dropout);
      std::vector<double> acc(d, 0.0);
      for (std::int64_t j = 0; j < keys; ++j) {
        if (detail::dropout_value(st.seed, 0, b, s.heads, h, i, int(range.begin + j)) < threshold) continue;
        for (std::int64_t e = 0; e < d; ++e) acc[e] += score[j] / sum * v1[j * d + e];
      }
      for (std::int64_t e = 0; e < d; ++e) expected[e] = float(acc[e] / (1.0 - double(s.dropout)));
    } else if (range.end > range.begin) {
      const std::int64_t keys = range.end - range.begin;
      const std::int64_t k_offset = ((std::int64_t(b) * s.keys() + range.begin) * hk + hkv) * d;
      std::vector<float> q1 = gather(st.q, row, 1, d, d), k1 = gather(st.k, k_offset, keys, hk * d, d),
                         v1 = gather(st.v, k_offset, keys, hk * d, d);
      // ALiBi measures distance from the row's diagonal, i + nk - n; in the one-query problem
      // over keys [begin, end) it would lie at end - 1. With `pad` zero query rows after the
      // real one (row 0 of 1 + pad), the problem's diagonal for row 0 is keys - 1 - pad, which
      // is the row's own for pad = end - 1 - (i + nk - n) >= 0 (0 when causal).
      const std::int64_t pad = s.alibi ? range.end - 1 - (i + s.keys() - s.seqlen) : 0;
      q1.resize(std::size_t((1 + pad) * d), 0.0f);
      std::vector<float> slope1 = {s.alibi ? float(st.slopes.get(h)) : 0.0f};
      HostTensor out1(DType::f32, {1, 1 + pad, 1, d});
      ForwardArgs a;
      a.softcap = s.softcap;
      a.softmax_scale = 1.0f / std::sqrt(float(d));
      a.q = TensorView::contiguous(q1.data(), DType::f32, {1, 1 + pad, 1, d});
      a.k = TensorView::contiguous(k1.data(), DType::f32, {1, keys, 1, d});
      a.v = TensorView::contiguous(v1.data(), DType::f32, {1, keys, 1, d});
      a.out = out1.view();
      if (s.alibi) a.alibi_slopes = TensorView::contiguous(slope1.data(), DType::f32, {1});
      reference::forward(a);
      expected = out1.to_floats();
      expected.resize(std::size_t(d));  // row 0
    }
    double num = 0, den = 0;
    for (std::int64_t e = 0; e < d; ++e) {
      const double got = st.out.get(row + e), want = expected[e];
      num += (got - want) * (got - want);
      den += want * want;
    }
    const double err = std::isnan(num) ? INFINITY : den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    result.max_error = std::max(result.max_error, err);
    ++result.rows;
  }
  return result;
}

}  // namespace flashattn::tools
