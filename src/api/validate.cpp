#include "api/validate.hpp"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "api/kv_cache.hpp"
#include "common/mask.hpp"
#include "flashattn/error.hpp"

namespace flashattn::detail {
namespace {

constexpr int kMaxHeadDim = 1024;
// The GPU kernels' widest instance; every head dim up to it runs (on the next wider instance).
constexpr int kMaxGpuHeadDim = 256;

std::string shape_string(const TensorView& t) {
  std::string s = "[";
  for (int i = 0; i < t.rank; ++i) s += (i ? ", " : "") + std::to_string(t.shape[i]);
  return s + "]";
}

std::string shape_string(std::initializer_list<std::int64_t> dims) {
  std::string s = "[";
  bool first = true;
  for (auto d : dims) {
    s += (first ? "" : ", ") + std::to_string(d);
    first = false;
  }
  return s + "]";
}

[[noreturn]] void fail(const std::string& arg, const std::string& expected, const std::string& given,
                       ErrorKind kind = ErrorKind::invalid_argument) {
  throw Error(kind, arg, expected, given);
}

// The checks every tensor argument gets: present, rank, sizes, strides, pointer, alignment.
// Pointers need only their element's alignment, on the GPU too: kernels move 16-byte vectors
// where pointers and strides allow and element by element otherwise (cuda/common/head_columns.cuh).
void check_tensor(const char* name, const TensorView& t, int rank) {
  if (!t.present()) fail(name, "a tensor", "none");
  if (t.rank != rank)
    fail(name, std::to_string(rank) + " dimensions", std::to_string(t.rank) + " (shape " + shape_string(t) + ")");
  for (int i = 0; i < rank; ++i) {
    if (t.shape[i] < 0)
      fail(std::string(name) + ".shape", "non-negative sizes", shape_string(t));
    if (t.shape[i] > INT32_MAX)
      fail(std::string(name) + ".shape", "sizes below 2^31", shape_string(t));
    if (t.stride[i] < 0)
      fail(std::string(name) + ".stride[" + std::to_string(i) + "]", "a non-negative stride",
           std::to_string(t.stride[i]));
  }
  if (t.shape[rank - 1] > 1 && t.stride[rank - 1] != 1)
    fail(std::string(name) + ".stride[" + std::to_string(rank - 1) + "]",
         "1 (the last dimension contiguous)", std::to_string(t.stride[rank - 1]));
  if (t.numel() > 0 && t.data == nullptr) fail(std::string(name) + ".data", "a non-null pointer", "null");
  const std::size_t esize = element_size(t.dtype);
  const auto address = reinterpret_cast<std::uintptr_t>(t.data);
  if (esize != 0 && address % esize != 0)
    fail(std::string(name) + ".data", "a pointer aligned to its element size",
         "address " + std::to_string(address));
}

void check_same_placement(const char* name, const TensorView& t, const TensorView& q) {
  if (t.device != q.device || t.device_index != q.device_index)
    fail(std::string(name) + ".device", std::string("the device of q (") + to_string(q.device) + ":" +
                                            std::to_string(q.device_index) + ")",
         std::string(to_string(t.device)) + ":" + std::to_string(t.device_index),
         ErrorKind::invalid_type);
}

void check_dtype(const char* name, const TensorView& t, DType expected) {
  if (t.dtype != expected)
    fail(std::string(name) + ".dtype", to_string(expected), to_string(t.dtype), ErrorKind::invalid_type);
}

void check_shape(const char* name, const TensorView& t, std::initializer_list<std::int64_t> dims,
                 const char* what) {
  int i = 0;
  bool same = int(dims.size()) == t.rank;
  for (auto d : dims) same = same && t.shape[i++] == d;
  if (!same) fail(std::string(name) + ".shape", std::string(what) + " " + shape_string(dims), shape_string(t));
}

SeqTensor seq_tensor(const TensorView& t, bool varlen) {
  // Fixed: (batch, seq, heads, dim). Variable length: (total, heads, dim).
  if (varlen) return {t.data, 0, t.stride[0], t.stride[1]};
  return {t.data, t.stride[0], t.stride[1], t.stride[2]};
}

// Reads and checks CPU-resident offsets; returns the largest length.
void check_cu_seqlens_contents(const char* name, const TensorView& cu, std::int64_t total, int max_len,
                               const char* max_name) {
  const auto* offsets = static_cast<const std::int32_t*>(cu.data);
  const std::int64_t n = cu.shape[0];
  const std::int64_t s = cu.stride[0];
  if (offsets[0] != 0) fail(std::string(name) + "[0]", "0", std::to_string(offsets[0]));
  for (std::int64_t i = 1; i < n; ++i) {
    const std::int64_t prev = offsets[(i - 1) * s], cur = offsets[i * s];
    if (cur < prev)
      fail(std::string(name) + "[" + std::to_string(i) + "]",
           "non-decreasing offsets (>= " + std::to_string(prev) + ")", std::to_string(cur));
    if (cur > total)
      fail(std::string(name) + "[" + std::to_string(i) + "]",
           "an offset within the packed tensor (<= " + std::to_string(total) + ")", std::to_string(cur));
    if (cur - prev > max_len)
      fail(max_name, "at least every sequence's length (sequence " + std::to_string(i - 1) +
                         " has " + std::to_string(cur - prev) + ")",
           std::to_string(max_len));
  }
}

struct Layout {
  bool varlen = false;
  int batch = 0, seqlen_q = 0, seqlen_k = 0, heads_q = 0, heads_kv = 0, head_dim = 0;
  std::int64_t total_q = 0, total_k = 0;  // varlen only
};

// ALiBi slopes: float32 (heads_q,) or (batch, heads_q), last dimension contiguous, on q's device.
void check_alibi(const AttentionOptions& o, const Layout& L, const TensorView& q) {
  const TensorView& a = o.alibi_slopes;
  if (!a.present()) return;
  if (a.rank != 1 && a.rank != 2)
    fail("alibi_slopes", "1 dimension (heads_q,) or 2 (batch, heads_q)",
         std::to_string(a.rank) + " (shape " + shape_string(a) + ")");
  check_tensor("alibi_slopes", a, a.rank);
  check_dtype("alibi_slopes", a, DType::f32);
  check_same_placement("alibi_slopes", a, q);
  if (a.rank == 1) check_shape("alibi_slopes", a, {L.heads_q}, "(heads_q,) =");
  else check_shape("alibi_slopes", a, {L.batch, L.heads_q}, "(batch, heads_q) =");
  if (o.softmax_scale && *o.softmax_scale == 0.0f && o.softcap == 0.0f)
    fail("softmax_scale", "a non-zero scale with alibi_slopes (kernels add the bias in units of the scale)",
         "0");
  if (a.device == DeviceKind::cpu) {
    const auto* s = static_cast<const float*>(a.data);
    const std::int64_t rows = a.rank == 1 ? 1 : a.shape[0], batch_stride = a.rank == 1 ? 0 : a.stride[0];
    for (std::int64_t b = 0; b < rows; ++b)
      for (std::int64_t h = 0; h < a.shape[a.rank - 1]; ++h)
        if (!std::isfinite(s[b * batch_stride + h]))
          fail("alibi_slopes[" + (a.rank == 1 ? "" : std::to_string(b) + ", ") + std::to_string(h) + "]",
               "a finite slope", std::to_string(s[b * batch_stride + h]));
  }
}

// e4m3 q, k, v (the FP8 forward): what it runs on and what it leaves out.
void check_fp8(const AttentionOptions& o, const TensorView& q) {
  if (q.device != DeviceKind::cuda)
    fail("q.dtype", "f32, f16 or bf16 on the CPU backend (e4m3 runs on the CUDA backend, on Hopper)", "e4m3",
         ErrorKind::unsupported);
  if (o.dropout_p > 0.0f)
    fail("dropout_p", "0 with e4m3 inputs (the FP8 forward has no dropout)", std::to_string(o.dropout_p),
         ErrorKind::unsupported);
  if (o.alibi_slopes.present())
    fail("alibi_slopes", "none with e4m3 inputs (the FP8 forward has no ALiBi)", "a tensor", ErrorKind::unsupported);
}

// q, k, v and the options: everything both directions share. fp8: the call takes e4m3 inputs
// (the plain forward; the others reject them).
Layout check_inputs(const AttentionOptions& o, const TensorView& q, const TensorView& k, const TensorView& v,
                    bool fp8 = false) {
  Layout L;
  if (o.cu_seqlens_q.present() != o.cu_seqlens_k.present())
    fail(o.cu_seqlens_q.present() ? "cu_seqlens_k" : "cu_seqlens_q",
         "cu_seqlens_q and cu_seqlens_k both given or both absent", "only one");
  L.varlen = o.cu_seqlens_q.present();
  const int rank = L.varlen ? 3 : 4;
  check_tensor("q", q, rank);
  check_tensor("k", k, rank);
  check_tensor("v", v, rank);

  if (q.dtype == DType::e4m3 && fp8)
    check_fp8(o, q);
  else if (q.dtype != DType::f32 && q.dtype != DType::f16 && q.dtype != DType::bf16)
    fail("q.dtype",
         q.dtype == DType::e4m3 ? "f32, f16 or bf16 (e4m3 only in the forward without paged K/V)" : "f32, f16 or bf16",
         to_string(q.dtype),
         q.dtype == DType::e4m3 || q.dtype == DType::e5m2 ? ErrorKind::unsupported : ErrorKind::invalid_type);
  check_dtype("k", k, q.dtype);
  check_dtype("v", v, q.dtype);
  check_same_placement("k", k, q);
  check_same_placement("v", v, q);
#ifndef FLASHATTN_WITH_CUDA
  if (q.device == DeviceKind::cuda)
    fail("q.device", "cpu (this build of flashattn has no CUDA backend)", "cuda", ErrorKind::unsupported);
#endif

  const int d = rank - 1;
  L.head_dim = int(q.shape[d]);
  L.heads_q = int(q.shape[d - 1]);
  L.heads_kv = int(k.shape[d - 1]);
  if (L.head_dim < 1 || L.head_dim > kMaxHeadDim)
    fail("q.shape[" + std::to_string(d) + "] (head_dim)", "1 to " + std::to_string(kMaxHeadDim),
         std::to_string(L.head_dim), L.head_dim > kMaxHeadDim ? ErrorKind::unsupported : ErrorKind::invalid_argument);
  if (q.device == DeviceKind::cuda && L.head_dim > kMaxGpuHeadDim)
    fail("q.shape[" + std::to_string(d) + "] (head_dim)",
         "1 to " + std::to_string(kMaxGpuHeadDim) + " on the CUDA backend (the CPU backend takes up to " +
             std::to_string(kMaxHeadDim) + ")",
         std::to_string(L.head_dim), ErrorKind::unsupported);
  if (k.shape[d] != L.head_dim)
    fail("k.shape[" + std::to_string(d) + "] (head_dim)", "the head_dim of q (" + std::to_string(L.head_dim) + ")",
         std::to_string(k.shape[d]));
  if (v.shape[d] != L.head_dim)
    fail("v.shape[" + std::to_string(d) + "] (head_dim)", "the head_dim of q (" + std::to_string(L.head_dim) + ")",
         std::to_string(v.shape[d]));
  if (L.heads_kv < 1)
    fail("k.shape[" + std::to_string(d - 1) + "] (heads_kv)", "at least 1", std::to_string(L.heads_kv));
  if (v.shape[d - 1] != L.heads_kv)
    fail("v.shape[" + std::to_string(d - 1) + "] (heads_kv)",
         "the heads of k (" + std::to_string(L.heads_kv) + ")", std::to_string(v.shape[d - 1]));
  if (L.heads_q < 1 || L.heads_q % L.heads_kv != 0)
    fail("q.shape[" + std::to_string(d - 1) + "] (heads_q)",
         "a positive multiple of heads_kv (" + std::to_string(L.heads_kv) + ")", std::to_string(L.heads_q));

  if (!L.varlen) {
    L.batch = int(q.shape[0]);
    L.seqlen_q = int(q.shape[1]);
    L.seqlen_k = int(k.shape[1]);
    if (k.shape[0] != L.batch)
      fail("k.shape[0] (batch)", "the batch of q (" + std::to_string(L.batch) + ")", std::to_string(k.shape[0]));
    if (v.shape[0] != L.batch)
      fail("v.shape[0] (batch)", "the batch of q (" + std::to_string(L.batch) + ")", std::to_string(v.shape[0]));
    if (v.shape[1] != L.seqlen_k)
      fail("v.shape[1] (seqlen_k)", "the seqlen of k (" + std::to_string(L.seqlen_k) + ")",
           std::to_string(v.shape[1]));
  } else {
    L.total_q = q.shape[0];
    L.total_k = k.shape[0];
    if (v.shape[0] != L.total_k)
      fail("v.shape[0] (total_k)", "the total of k (" + std::to_string(L.total_k) + ")", std::to_string(v.shape[0]));
    const std::pair<const char*, const TensorView*> cus[] = {{"cu_seqlens_q", &o.cu_seqlens_q},
                                                             {"cu_seqlens_k", &o.cu_seqlens_k}};
    for (auto [name, cu] : cus) {
      check_tensor(name, *cu, 1);
      check_dtype(name, *cu, DType::i32);
      check_same_placement(name, *cu, q);
      if (cu->shape[0] < 1) fail(std::string(name) + ".shape", "batch + 1 >= 1 entries", shape_string(*cu));
    }
    if (o.cu_seqlens_k.shape[0] != o.cu_seqlens_q.shape[0])
      fail("cu_seqlens_k.shape", "the length of cu_seqlens_q (" + std::to_string(o.cu_seqlens_q.shape[0]) + ")",
           shape_string(o.cu_seqlens_k));
    L.batch = int(o.cu_seqlens_q.shape[0] - 1);
    if (o.max_seqlen_q < 0) fail("max_seqlen_q", "a non-negative length", std::to_string(o.max_seqlen_q));
    if (o.max_seqlen_k < 0) fail("max_seqlen_k", "a non-negative length", std::to_string(o.max_seqlen_k));
    L.seqlen_q = o.max_seqlen_q;
    L.seqlen_k = o.max_seqlen_k;
    if (q.device == DeviceKind::cpu) {
      check_cu_seqlens_contents("cu_seqlens_q", o.cu_seqlens_q, L.total_q, o.max_seqlen_q, "max_seqlen_q");
      check_cu_seqlens_contents("cu_seqlens_k", o.cu_seqlens_k, L.total_k, o.max_seqlen_k, "max_seqlen_k");
    }
  }

  if (o.softmax_scale && !std::isfinite(*o.softmax_scale))
    fail("softmax_scale", "a finite number", std::to_string(*o.softmax_scale));
  if (!std::isfinite(o.softcap) || o.softcap < 0)
    fail("softcap", "a finite number >= 0 (0 = off)", std::to_string(o.softcap));
  if (o.sm_margin < 0) fail("sm_margin", ">= 0 (SMs left free; 0 = none)", std::to_string(o.sm_margin));
  if (o.window_left < -1) fail("window_left", ">= -1 (-1 = unbounded)", std::to_string(o.window_left));
  if (o.window_right < -1) fail("window_right", ">= -1 (-1 = unbounded)", std::to_string(o.window_right));
  // causal with any window_right: causal sets it to 0 (fill_problem), as flash-attn does.
  check_alibi(o, L, q);
  if (!(o.dropout_p >= 0.0f && o.dropout_p < 1.0f))
    fail("dropout_p", "a probability in [0, 1)", std::to_string(o.dropout_p));
  if (o.dropout_state.present()) {
    check_tensor("dropout_state", o.dropout_state, 1);
    check_dtype("dropout_state", o.dropout_state, DType::i64);
    check_same_placement("dropout_state", o.dropout_state, q);
    check_shape("dropout_state", o.dropout_state, {2}, "(seed, offset) =");
    if (o.dropout_state.data == nullptr) fail("dropout_state.data", "a non-null pointer", "null");
  }
  return L;
}

void fill_problem(Problem& p, const AttentionOptions& o, const Layout& L, const TensorView& q,
                  const TensorView& k, const TensorView& v) {
  p.dtype = q.dtype;
  p.device = q.device;
  p.device_index = q.device_index;
  p.stream = o.stream;
  p.sm_margin = o.sm_margin;
  p.batch = L.batch;
  p.heads_q = L.heads_q;
  p.heads_kv = L.heads_kv;
  p.head_dim = L.head_dim;
  p.seqlen_q = L.seqlen_q;
  p.seqlen_k = L.seqlen_k;
  if (L.varlen) {
    p.cu_seqlens_q = static_cast<const std::int32_t*>(o.cu_seqlens_q.data);
    p.cu_seqlens_k = static_cast<const std::int32_t*>(o.cu_seqlens_k.data);
    p.total_q = L.total_q;
    p.total_k = L.total_k;
  }
  p.scale = o.softmax_scale ? *o.softmax_scale : 1.0f / std::sqrt(float(L.head_dim));
  p.softcap = o.softcap;
  // Normalize the mask as flash-attn does (common/mask.hpp); dropping bounds that never cut
  // also keeps index arithmetic in kernels far from overflow.
  const Window w = normalized_window(o.causal, o.window_left, o.window_right, L.seqlen_q, L.seqlen_k);
  p.window_left = w.left;
  p.window_right = w.right;
  p.causal = w.left < 0 && w.right == 0;
  if (o.alibi_slopes.present())
    p.alibi = {static_cast<const float*>(o.alibi_slopes.data),
               o.alibi_slopes.rank == 2 ? o.alibi_slopes.stride[0] : 0};
  if (o.dropout_p > 0.0f) {
    p.dropout.p = o.dropout_p;
    p.dropout.keep_scale = float(1.0 / (1.0 - double(o.dropout_p)));
    p.dropout.threshold = dropout_threshold(o.dropout_p);
    p.dropout.seed = o.dropout_seed;
    p.dropout.offset = o.dropout_offset;
    if (o.dropout_state.present()) p.dropout.state = static_cast<const std::uint64_t*>(o.dropout_state.data);
  }
  p.q = seq_tensor(q, L.varlen);
  p.k = seq_tensor(k, L.varlen);
  p.v = seq_tensor(v, L.varlen);
}

void check_same_shape(const char* name, const TensorView& t, const TensorView& like, const char* like_name) {
  bool same = true;
  for (int i = 0; i < like.rank; ++i) same = same && t.shape[i] == like.shape[i];
  if (!same) fail(std::string(name) + ".shape", std::string("the shape of ") + like_name + " " + shape_string(like),
                  shape_string(t));
}

void check_like(const char* name, const TensorView& t, const TensorView& like, const char* like_name) {
  check_tensor(name, t, like.rank);
  check_dtype(name, t, like.dtype);
  check_same_placement(name, t, like);
  check_same_shape(name, t, like, like_name);
}

RowVector check_lse(const char* name, const TensorView& lse, const Layout& L, const TensorView& q) {
  check_tensor(name, lse, L.varlen ? 2 : 3);
  check_dtype(name, lse, DType::f32);
  check_same_placement(name, lse, q);
  if (L.varlen) {
    check_shape(name, lse, {L.heads_q, L.total_q}, "(heads_q, total_q) =");
    return {static_cast<float*>(lse.data), 0, lse.stride[0]};
  }
  check_shape(name, lse, {L.batch, L.heads_q, L.seqlen_q}, "(batch, heads_q, seqlen_q) =");
  return {static_cast<float*>(lse.data), lse.stride[0], lse.stride[1]};
}

// An FP8 descale factor: none, (1,), (batch, heads_kv) or, for q and k (rows: seqlen_q or
// seqlen_k; -1 for v), (batch, heads_kv, ceil(rows / kFp8ScaleBlockRows)) for block quantization;
// float32, on q's device.
Descale check_descale(const char* name, const TensorView& t, const Layout& L, const TensorView& q, int rows) {
  if (!t.present()) return {};
  if (q.dtype != DType::e4m3) fail(name, "none (descale factors go with e4m3 inputs)", "a tensor");
  const int blocks = int(fp8_scale_blocks(rows));
  if (t.rank == 1) {
    check_tensor(name, t, 1);
    check_shape(name, t, {1}, "one factor per tensor:");
  } else if (t.rank == 3 && rows >= 0) {
    check_tensor(name, t, 3);
    const std::string what = "(batch, heads_kv, blocks of " + std::to_string(kFp8ScaleBlockRows) + " rows) =";
    check_shape(name, t, {L.batch, L.heads_kv, blocks}, what.c_str());
  } else {
    if (t.rank == 3)
      fail(name, "(batch, heads_kv) or (1,): V's factor scales the output once, so it has no blocks",
           shape_string(t));
    check_tensor(name, t, 2);
    check_shape(name, t, {L.batch, L.heads_kv}, "(batch, heads_kv) =");
  }
  check_dtype(name, t, DType::f32);
  check_same_placement(name, t, q);
  if (t.rank == 1) return {static_cast<const float*>(t.data), 0, 0};
  if (t.rank == 2) return {static_cast<const float*>(t.data), t.stride[0], t.stride[1]};
  return {static_cast<const float*>(t.data), t.stride[0], t.stride[1], blocks, t.stride[2]};
}

// out: q's shape, and q's dtype, or f16 / bf16 for e4m3 inputs.
void check_out(const TensorView& out, const TensorView& q) {
  if (q.dtype != DType::e4m3) return check_like("out", out, q, "q");
  check_tensor("out", out, q.rank);
  if (out.dtype != DType::f16 && out.dtype != DType::bf16)
    fail("out.dtype", "f16 or bf16 (the output of e4m3 inputs)", to_string(out.dtype), ErrorKind::invalid_type);
  check_same_placement("out", out, q);
  check_same_shape("out", out, q, "q");
}

}  // namespace

ForwardProblem make_forward_problem(const ForwardArgs& a) {
  if (a.block_table.present() || a.seqused_k.present()) return make_paged_forward_problem(a);  // api/kv_cache.cpp
  const Layout L = check_inputs(a, a.q, a.k, a.v, true);
  check_out(a.out, a.q);
  ForwardProblem p;
  fill_problem(p, a, L, a.q, a.k, a.v);
  p.out_dtype = a.out.dtype;
  p.q_descale = check_descale("q_descale", a.q_descale, L, a.q, L.seqlen_q);
  p.k_descale = check_descale("k_descale", a.k_descale, L, a.q, L.seqlen_k);
  p.v_descale = check_descale("v_descale", a.v_descale, L, a.q, -1);
  p.out = seq_tensor(a.out, L.varlen);
  if (a.lse.present()) p.lse = check_lse("lse", a.lse, L, a.q);
  return p;
}

QuantizeProblem make_quantize_problem(const QuantizeArgs& a) {
  check_tensor("x", a.x, 4);
  if (a.x.dtype != DType::f32 && a.x.dtype != DType::f16 && a.x.dtype != DType::bf16)
    fail("x.dtype", "f32, f16 or bf16", to_string(a.x.dtype), ErrorKind::invalid_type);
  check_tensor("out", a.out, 4);
  check_dtype("out", a.out, DType::e4m3);
  check_same_placement("out", a.out, a.x);
  check_same_shape("out", a.out, a.x, "x");
  QuantizeProblem p;
  p.device = a.x.device;
  p.device_index = a.x.device_index;
  p.stream = a.stream;
  p.dtype = a.x.dtype;
  p.batch = int(a.x.shape[0]);
  p.seqlen = int(a.x.shape[1]);
  p.heads = int(a.x.shape[2]);
  p.head_dim = int(a.x.shape[3]);
  if (p.head_dim < 1 || p.head_dim > kMaxHeadDim)
    fail("x.shape[3] (head_dim)", "1 to " + std::to_string(kMaxHeadDim), std::to_string(p.head_dim));
  if (p.device == DeviceKind::cuda && p.head_dim > kMaxGpuHeadDim)
    fail("x.shape[3] (head_dim)", "1 to " + std::to_string(kMaxGpuHeadDim) + " on the CUDA backend",
         std::to_string(p.head_dim), ErrorKind::unsupported);
#ifndef FLASHATTN_WITH_CUDA
  if (p.device == DeviceKind::cuda)
    fail("x.device", "cpu (this build of flashattn has no CUDA backend)", "cuda", ErrorKind::unsupported);
#endif
  const int heads_kv = a.heads_kv == 0 ? p.heads : a.heads_kv;
  if (heads_kv < 1 || p.heads % heads_kv != 0)
    fail("heads_kv", "a divisor of x's heads (" + std::to_string(p.heads) + "), or 0", std::to_string(a.heads_kv));
  if (a.per_tensor && a.per_block) fail("per_block", "false with per_tensor (one factor or one per block)", "true");
  p.per_tensor = a.per_tensor;
  p.slots_per_sequence = heads_kv;
  p.blocks = a.per_block ? int(fp8_scale_blocks(p.seqlen)) : 1;
  check_tensor("descale", a.descale, a.per_tensor ? 1 : a.per_block ? 3 : 2);
  check_dtype("descale", a.descale, DType::f32);
  check_same_placement("descale", a.descale, a.x);
  if (a.per_tensor) {
    check_shape("descale", a.descale, {1}, "one factor per tensor:");
  } else if (a.per_block) {
    const std::string what = "(batch, heads_kv, blocks of " + std::to_string(kFp8ScaleBlockRows) + " rows) =";
    check_shape("descale", a.descale, {p.batch, heads_kv, p.blocks}, what.c_str());
    if (p.blocks > 1 && a.descale.stride[2] != 1)
      fail("descale.stride[2]", "1 (the blocks contiguous)", std::to_string(a.descale.stride[2]));
  } else if (heads_kv > 1 && a.descale.stride[1] != 1) {
    fail("descale.stride[1]", "1 (the KV heads contiguous)", std::to_string(a.descale.stride[1]));
  }
  if (!a.per_tensor) {
    p.descale_batch_stride = a.descale.stride[0];
    p.descale_head_stride = a.per_block || heads_kv > 1 ? a.descale.stride[1] : 0;
  }
  if (a.signs.present()) {
    check_tensor("signs", a.signs, 1);
    check_dtype("signs", a.signs, DType::f32);
    check_same_placement("signs", a.signs, a.x);
    check_shape("signs", a.signs, {p.head_dim}, "(head_dim,) =");
    if (p.head_dim & (p.head_dim - 1))
      fail("x.shape[3] (head_dim)", "a power of two with signs (the Walsh-Hadamard transform)",
           std::to_string(p.head_dim));
    p.signs = static_cast<const float*>(a.signs.data);
  }
  p.transform_scale = 1.0f / std::sqrt(float(p.head_dim));
  p.x = a.x.data;
  p.x_batch_stride = a.x.stride[0];
  p.x_seq_stride = a.x.stride[1];
  p.x_head_stride = a.x.stride[2];
  p.out = static_cast<std::uint8_t*>(a.out.data);
  p.out_batch_stride = a.out.stride[0];
  p.out_seq_stride = a.out.stride[1];
  p.out_head_stride = a.out.stride[2];
  p.descale = static_cast<float*>(a.descale.data);
  return p;
}

BackwardProblem make_backward_problem(const BackwardArgs& a) {
  const Layout L = check_inputs(a, a.q, a.k, a.v);
  check_like("out", a.out, a.q, "q");
  check_like("dout", a.dout, a.q, "q");
  check_like("dq", a.dq, a.q, "q");
  check_like("dk", a.dk, a.k, "k");
  check_like("dv", a.dv, a.v, "v");
  if (!a.lse.present()) fail("lse", "the forward's LSE (required by the backward)", "none");
  BackwardProblem p;
  fill_problem(p, a, L, a.q, a.k, a.v);
  p.lse = check_lse("lse", a.lse, L, a.q);
  p.out = seq_tensor(a.out, L.varlen);
  p.dout = seq_tensor(a.dout, L.varlen);
  p.dq = seq_tensor(a.dq, L.varlen);
  p.dk = seq_tensor(a.dk, L.varlen);
  p.dv = seq_tensor(a.dv, L.varlen);
  p.deterministic = a.deterministic;
  return p;
}

}  // namespace flashattn::detail
