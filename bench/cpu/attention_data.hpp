#pragma once
// The tensors of one attention call on the CPU, (batch, seq, heads, dim) or packed variable
// length, filled with fresh N(0, magnitude^2) values: shared by cpu_bench and cpu_check.
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/numeric.hpp"
#include "flashattn/attention.hpp"

namespace flashattn::bench {

struct Shape {
  int batch = 1, heads_q = 1, heads_kv = 1, seqlen_q = 1, seqlen_k = 1, head_dim = 64;
  bool causal = false;
  int window_left = -1, window_right = -1;
  float softcap = 0.0f;
  std::vector<int> lens_q, lens_k;  // non-empty: variable length
  bool varlen() const { return !lens_q.empty(); }
};

// Storage of one tensor in any of f32, f16, bf16.
struct Buffer {
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;
  std::vector<unsigned char> bytes;

  Buffer() = default;
  Buffer(DType t, std::vector<std::int64_t> s) : dtype(t), shape(std::move(s)) {
    bytes.resize(numel() * element_size(dtype));
  }
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
  float get(std::int64_t i) const {
    std::uint16_t h;
    switch (dtype) {
      case DType::f32: return reinterpret_cast<const float*>(bytes.data())[i];
      case DType::bf16: std::memcpy(&h, bytes.data() + 2 * i, 2); return detail::bf16_to_float(h);
      default: std::memcpy(&h, bytes.data() + 2 * i, 2); return detail::half_to_float(h);
    }
  }
  void set(std::int64_t i, float x) {
    std::uint16_t h;
    switch (dtype) {
      case DType::f32: reinterpret_cast<float*>(bytes.data())[i] = x; return;
      case DType::bf16: h = detail::float_to_bf16(x); break;
      default: h = detail::float_to_half(x); break;
    }
    std::memcpy(bytes.data() + 2 * i, &h, 2);
  }
  void fill_normal(std::mt19937_64& rng, float stddev) {
    std::normal_distribution<float> normal(0.0f, stddev);
    for (std::int64_t i = 0; i < numel(); ++i) set(i, normal(rng));
  }
  void poison() { std::memset(bytes.data(), 0xff, bytes.size()); }
  std::vector<float> floats() const {
    std::vector<float> x(numel());
    for (std::int64_t i = 0; i < numel(); ++i) x[i] = get(i);
    return x;
  }
  TensorView view() {
    TensorView t;
    t.data = bytes.data();
    t.dtype = dtype;
    t.rank = int(shape.size());
    std::int64_t stride = 1;
    for (int i = t.rank - 1; i >= 0; --i) {
      t.shape[i] = shape[i];
      t.stride[i] = stride;
      stride *= shape[i];
    }
    return t;
  }
};

struct AttentionData {
  Shape shape;
  Buffer q, k, v, out, lse, dout, dq, dk, dv;
  Buffer cu_q, cu_k;

  AttentionData(const Shape& s, DType dtype, std::uint64_t seed, float magnitude = 1.0f) : shape(s) {
    const std::int64_t d = s.head_dim;
    auto operand = [&](int seqlen, const std::vector<int>& lens, int heads) {
      if (!s.varlen()) return Buffer(dtype, {s.batch, seqlen, heads, d});
      std::int64_t total = 0;
      for (int n : lens) total += n;
      return Buffer(dtype, {total, heads, d});
    };
    q = operand(s.seqlen_q, s.lens_q, s.heads_q);
    k = operand(s.seqlen_k, s.lens_k, s.heads_kv);
    v = operand(s.seqlen_k, s.lens_k, s.heads_kv);
    out = operand(s.seqlen_q, s.lens_q, s.heads_q);
    dout = out, dq = out;
    dk = k, dv = k;
    lse = s.varlen() ? Buffer(DType::f32, {s.heads_q, q.shape[0]}) : Buffer(DType::f32, {s.batch, s.heads_q, s.seqlen_q});
    if (s.varlen()) {
      cu_q = offsets(s.lens_q);
      cu_k = offsets(s.lens_k);
    }
    std::mt19937_64 rng(seed);
    q.fill_normal(rng, magnitude);
    k.fill_normal(rng, magnitude);
    v.fill_normal(rng, magnitude);
    dout.fill_normal(rng, 1.0f);
    for (Buffer* b : {&out, &lse, &dq, &dk, &dv}) b->poison();
  }

  static Buffer offsets(const std::vector<int>& lens) {
    Buffer b(DType::i32, {std::int64_t(lens.size()) + 1});
    auto* p = reinterpret_cast<std::int32_t*>(b.bytes.data());
    p[0] = 0;
    for (std::size_t i = 0; i < lens.size(); ++i) p[i + 1] = p[i] + lens[i];
    return b;
  }

  void options(AttentionOptions& o) {
    o.causal = shape.causal;
    o.window_left = shape.window_left;
    o.window_right = shape.window_right;
    o.softcap = shape.softcap;
    if (shape.varlen()) {
      o.cu_seqlens_q = cu_q.view();
      o.cu_seqlens_k = cu_k.view();
      for (int n : shape.lens_q) o.max_seqlen_q = std::max(o.max_seqlen_q, n);
      for (int n : shape.lens_k) o.max_seqlen_k = std::max(o.max_seqlen_k, n);
    }
  }
  ForwardArgs forward_args(bool with_lse = true) {
    ForwardArgs a;
    options(a);
    a.q = q.view(), a.k = k.view(), a.v = v.view(), a.out = out.view();
    if (with_lse) a.lse = lse.view();
    return a;
  }
  BackwardArgs backward_args() {
    BackwardArgs a;
    options(a);
    a.q = q.view(), a.k = k.view(), a.v = v.view(), a.out = out.view(), a.dout = dout.view();
    a.lse = lse.view(), a.dq = dq.view(), a.dk = dk.view(), a.dv = dv.view();
    return a;
  }
};

// FLOPs as the FlashAttention papers count them: 4 b h n_q n_k d, halved when causal.
inline double forward_flops(const Shape& s) {
  return 4.0 * s.batch * s.heads_q * double(s.seqlen_q) * s.seqlen_k * s.head_dim / (s.causal ? 2 : 1);
}

}  // namespace flashattn::bench
