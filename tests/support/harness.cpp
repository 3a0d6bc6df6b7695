#include "harness.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>

#include "api/validate.hpp"
#include "cpu/backend.hpp"
#include "device_buffer.hpp"
#include "flashattn/attention.hpp"
#include "flashattn/fp8.hpp"
#include "flashattn/reference.hpp"
#include "host_tensor.hpp"

namespace flashattn::testing {
namespace {

using host::DeviceBuffer;
using host::HostTensor;

int total(const std::vector<int>& lens) {
  int t = 0;
  for (int n : lens) t += n;
  return t;
}

// A (batch, seq, heads, dim) operand (or (total, heads, dim) for varlen) in the case's layout.
HostTensor make_operand(const Case& c, DType dtype, int seqlen, int heads, const std::vector<int>& lens) {
  const std::int64_t d = c.head_dim, h = heads;
  if (c.varlen()) {
    const std::int64_t t = total(lens);
    switch (c.layout) {
      case Layout::bshd: return HostTensor(dtype, {t, h, d});
      case Layout::bhsd: return HostTensor(dtype, {t, h, d}, {d, t * d, 1}, h * t * d);
      case Layout::padded: {
        const std::int64_t hs = d + 8, ss = h * hs + 8;
        return HostTensor(dtype, {t, h, d}, {ss, hs, 1}, t * ss);
      }
    }
  }
  const std::int64_t b = c.batch, s = seqlen;
  switch (c.layout) {
    case Layout::bshd: return HostTensor(dtype, {b, s, h, d});
    case Layout::bhsd: return HostTensor(dtype, {b, s, h, d}, {h * s * d, d, s * d, 1}, b * h * s * d);
    case Layout::padded: {
      const std::int64_t hs = d + 8, ss = h * hs + 8, bs = s * ss + 8;
      return HostTensor(dtype, {b, s, h, d}, {bs, ss, hs, 1}, b * bs);
    }
  }
  return {};
}

HostTensor make_lse(const Case& c) {
  if (c.varlen()) return HostTensor(DType::f32, {c.heads_q, total(c.lens_q)});
  return HostTensor(DType::f32, {c.batch, c.heads_q, c.seqlen_q});
}

HostTensor make_offsets(const std::vector<int>& lens) {
  HostTensor t(DType::i32, {std::int64_t(lens.size()) + 1});
  std::int32_t offset = 0;
  auto* p = static_cast<std::int32_t*>(t.data());
  p[0] = 0;
  for (std::size_t i = 0; i < lens.size(); ++i) p[i + 1] = offset += lens[i];
  return t;
}

int max_of(const std::vector<int>& lens) {
  int m = 0;
  for (int n : lens) m = std::max(m, n);
  return m;
}

// The case with its dropout stream drawn from the test seed: the seed, and an offset just
// below 2^32 so that the counters' low word carries into the high one within the call.
// Variable-length and padded cases pass the stream through a dropout_state tensor.
Case with_dropout_stream(const Case& c, std::uint64_t seed) {
  Case r = c;
  if (c.dropout_p > 0) {
    r.dropout_seed = seed * 0x9E3779B97F4A7C15ull + 0x5DEECE66Dull;
    r.dropout_offset = 0xFFFFFF00ull + (seed & 0xff) * 32;
    r.dropout_in_memory = c.varlen() || c.layout == Layout::padded;
  }
  return r;
}

// The dropout_state tensor of a case: (seed, offset) as int64.
HostTensor make_dropout_state(const Case& c) {
  HostTensor t(DType::i64, {2});
  auto* p = static_cast<std::uint64_t*>(t.data());
  p[0] = c.dropout_seed;
  p[1] = c.dropout_offset;
  return t;
}

// The case's ALiBi slopes (an empty tensor without ALiBi), drawn from `rng`.
HostTensor make_slopes(const Case& c, std::mt19937_64& rng) {
  if (c.alibi == Alibi::none) return HostTensor(DType::f32, {1});  // unused
  const std::int64_t batch = c.varlen() ? std::int64_t(c.lens_q.size()) : c.batch;
  HostTensor t = c.alibi == Alibi::heads ? HostTensor(DType::f32, {c.heads_q})
                                         : HostTensor(DType::f32, {batch, c.heads_q});
  std::uniform_real_distribution<float> slope(0.05f, 0.55f);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, slope(rng));
  return t;
}

// Options of a case, with cu_seqlens views pointing at `cu_q`/`cu_k`, the slopes at `slopes` on
// `device`, and the dropout state at `state` when given (the values otherwise).
void fill_options(AttentionOptions& o, const Case& c, TensorView cu_q, TensorView cu_k, TensorView slopes,
                  TensorView state = {}) {
  if (c.alibi != Alibi::none) o.alibi_slopes = slopes;
  o.dropout_p = c.dropout_p;
  o.dropout_seed = c.dropout_seed;
  o.dropout_offset = c.dropout_offset;
  if (c.dropout_p > 0 && c.dropout_in_memory) o.dropout_state = state;
  o.causal = c.causal;
  o.window_left = c.window_left;
  o.window_right = c.window_right;
  o.softcap = c.softcap;
  o.sm_margin = c.sm_margin;
  if (c.varlen()) {
    o.cu_seqlens_q = cu_q;
    o.cu_seqlens_k = cu_k;
    o.max_seqlen_q = max_of(c.lens_q);
    o.max_seqlen_k = max_of(c.lens_k);
  }
}

// The tensors of one call, on the host, plus their device copies when running on CUDA.
struct Operands {
  std::vector<HostTensor*> host;
  std::vector<DeviceBuffer> device;
  DeviceKind kind;

  Operands(DeviceKind k, std::vector<HostTensor*> tensors) : host(std::move(tensors)), kind(k) {
    if (kind == DeviceKind::cuda)
      for (HostTensor* t : host) device.push_back(DeviceBuffer::upload(*t));
  }
  TensorView view(std::size_t i) {
    return kind == DeviceKind::cuda ? host[i]->view(kind, device[i].data()) : host[i]->view();
  }
  void download(std::initializer_list<std::size_t> which) {
    if (kind != DeviceKind::cuda) return;
    host::device_synchronize();
    for (std::size_t i : which) device[i].download(*host[i]);
  }
};

// Reference out/LSE (f32) from f32 copies of the inputs; with round_to, the baseline.
void run_reference_forward(const Case& c, const HostTensor& q, const HostTensor& k, const HostTensor& v,
                           HostTensor& cu_q, HostTensor& cu_k, HostTensor& slopes, HostTensor& out,
                           HostTensor& lse, std::optional<DType> round_to) {
  HostTensor q32 = q.to_f32(), k32 = k.to_f32(), v32 = v.to_f32();
  ForwardArgs a;
  fill_options(a, c, cu_q.view(), cu_k.view(), slopes.view());
  a.q = q32.view();
  a.k = k32.view();
  a.v = v32.view();
  out = HostTensor(DType::f32, q32.shape());
  lse = make_lse(c);
  a.out = out.view();
  a.lse = lse.view();
  cpu::reference_forward(detail::make_forward_problem(a), round_to);
}

bool any_nan(const std::vector<float>& x) {
  for (float f : x)
    if (std::isnan(f)) return true;
  return false;
}

double max_lse_error(const std::vector<float>& lse, const std::vector<float>& ref, bool& masked_ok) {
  double worst = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    if (std::isinf(ref[i])) {
      if (!(std::isinf(lse[i]) && lse[i] < 0)) masked_ok = false;
      continue;
    }
    worst = std::max(worst, std::abs(double(lse[i]) - ref[i]) / std::max(1.0, std::abs(double(ref[i]))));
  }
  return worst;
}

}  // namespace

std::uint64_t test_seed() {
  if (const char* env = std::getenv("FLASHATTN_TEST_SEED")) return std::strtoull(env, nullptr, 10);
  static std::random_device device;
  return (std::uint64_t(device()) << 32) ^ device();
}

namespace {
// The size of the scaled scores, in the units of the logits (see tolerance in harness.hpp).
double score_scale(const Case& c) { return double(c.magnitude) * c.magnitude * std::sqrt(double(c.head_dim)); }
}  // namespace

double tolerance(double baseline, DType dtype, const Case& c) {
  const double floor = dtype == DType::f32 ? 2e-5 + 2 * 6e-8 * score_scale(c) : 2e-4;
  return 2.0 * baseline + floor;
}

double lse_tolerance(DType dtype, const Case& c) {
  return (dtype == DType::f32 ? 1e-5 : 1e-3) + 2 * 6e-8 * score_scale(c);
}

std::string ForwardCheck::describe() const {
  std::ostringstream s;
  s << "out error " << out_error << " (baseline " << out_baseline << "), lse error " << lse_error
    << ", all written " << all_written << ", padding untouched " << padding_untouched
    << ", masked rows ok " << masked_rows_ok;
  return s.str();
}

std::string BackwardCheck::describe() const {
  std::ostringstream s;
  s << "dq " << dq_error << " (baseline " << dq_baseline << "), dk " << dk_error << " (" << dk_baseline
    << "), dv " << dv_error << " (" << dv_baseline << "), all written " << all_written
    << ", padding untouched " << padding_untouched;
  return s.str();
}

ForwardCheck check_forward(const Case& case_, DType dtype, DeviceKind device, std::uint64_t seed) {
  const Case c = with_dropout_stream(case_, seed);
  std::mt19937_64 rng(seed);
  HostTensor q = make_operand(c, dtype, c.seqlen_q, c.heads_q, c.lens_q);
  HostTensor k = make_operand(c, dtype, c.seqlen_k, c.heads_kv, c.lens_k);
  HostTensor v = make_operand(c, dtype, c.seqlen_k, c.heads_kv, c.lens_k);
  for (HostTensor* t : {&q, &k, &v}) {
    t->poison();  // padding stays poisoned; logical elements are overwritten below
    t->fill_normal(rng, c.magnitude);
  }
  HostTensor out = make_operand(c, dtype, c.seqlen_q, c.heads_q, c.lens_q);
  HostTensor lse = make_lse(c);
  out.poison();
  lse.poison();
  HostTensor cu_q = make_offsets(c.lens_q), cu_k = make_offsets(c.lens_k);
  HostTensor slopes = make_slopes(c, rng);
  HostTensor state = make_dropout_state(c);

  Operands ops(device, {&q, &k, &v, &out, &lse, &cu_q, &cu_k, &slopes, &state});
  ForwardArgs a;
  fill_options(a, c, ops.view(5), ops.view(6), ops.view(7), ops.view(8));
  a.q = ops.view(0);
  a.k = ops.view(1);
  a.v = ops.view(2);
  a.out = ops.view(3);
  if (c.with_lse) a.lse = ops.view(4);
  forward(a);
  ops.download({3, 4});

  HostTensor ref_out, ref_lse, base_out, base_lse;
  run_reference_forward(c, q, k, v, cu_q, cu_k, slopes, ref_out, ref_lse, std::nullopt);
  run_reference_forward(c, q, k, v, cu_q, cu_k, slopes, base_out, base_lse, dtype);

  ForwardCheck r;
  const auto got = out.to_floats(), ref = ref_out.to_floats();
  r.out_error = host::relative_error(got, ref);
  r.out_baseline = host::relative_error(base_out.to_floats(), ref);
  r.all_written = !any_nan(got);
  r.padding_untouched = out.padding_untouched();
  const auto ref_l = ref_lse.to_floats();
  if (c.with_lse) {
    const auto got_l = lse.to_floats();
    r.all_written = r.all_written && !any_nan(got_l);
    r.lse_error = max_lse_error(got_l, ref_l, r.masked_rows_ok);
  }
  // Rows that see no key must be exactly zero.
  const std::int64_t d = c.head_dim;
  const int hq = c.heads_q;
  for (std::size_t row = 0; row * d < got.size(); ++row) {
    // Logical order is (.., seq, head, dim); the LSE is (.., head, seq): map row -> LSE index.
    const std::size_t head = row % hq, pos = row / hq;
    std::size_t lse_i;
    if (c.varlen()) {
      lse_i = head * std::size_t(total(c.lens_q)) + pos;
    } else {
      const std::size_t b = pos / c.seqlen_q, s = pos % c.seqlen_q;
      lse_i = (b * hq + head) * c.seqlen_q + s;
    }
    if (!std::isinf(ref_l[lse_i])) continue;
    for (std::int64_t e = 0; e < d; ++e)
      if (got[row * d + e] != 0.0f) r.masked_rows_ok = false;
  }
  return r;
}

std::string Fp8ForwardCheck::describe() const {
  std::ostringstream s;
  s << "worst |out - ref| / bound " << worst_ratio << ", lse error " << lse_error << ", all written "
    << all_written << ", masked rows ok " << masked_rows_ok;
  return s.str();
}

namespace {
// x (f32, (batch, seq, heads, dim) or packed (total, heads, dim) over sequences of lengths `lens`)
// -> e4m3 by the library's quantize_e4m3 (CPU; checked against float64 in test_quantize.cpp), with
// one descale factor per (sequence, group of `group` heads: a KV head), per (sequence, KV head,
// block of kFp8ScaleBlockRows rows), or one for the whole tensor. Writes the factors ((sequences,
// heads / group), (sequences, heads / group, blocks of the longest sequence), or (1,); a shorter
// sequence's unused blocks stay poisoned, which the kernel must not read for a visible key) and
// returns x dequantized: the values the kernel's inputs stand for.
HostTensor quantize_e4m3(const HostTensor& x, const std::vector<int>& lens, int group, Fp8Scales scales,
                         HostTensor& e4m3, HostTensor& descale) {
  const bool varlen = x.shape().size() == 3, per_tensor = scales == Fp8Scales::per_tensor;
  const bool per_block = scales == Fp8Scales::per_block;
  const std::int64_t heads = x.shape()[x.shape().size() - 2], d = x.shape().back(), slots = heads / group;
  const std::int64_t sequences = varlen ? std::int64_t(lens.size()) : x.shape()[0];
  const std::int64_t longest = varlen ? (lens.empty() ? 0 : *std::max_element(lens.begin(), lens.end())) : x.shape()[1];
  const std::int64_t blocks = fp8_scale_blocks(longest);
  descale = per_tensor  ? HostTensor(DType::f32, {1})
            : per_block ? HostTensor(DType::f32, {sequences, slots, blocks})
                        : HostTensor(DType::f32, {sequences, slots});
  descale.poison();
  e4m3 = HostTensor(DType::e4m3, x.shape());
  // The packed tensor seen as (1, rows, heads, dim) from row `first`; a fixed batch as it is.
  auto view = [&](HostTensor& t, std::int64_t first, std::int64_t rows) {
    if (!varlen) return t.view();
    const std::int64_t row = heads * d;
    return TensorView::strided(static_cast<char*>(t.data()) + first * row * element_size(t.dtype()), t.dtype(),
                               {1, rows, heads, d}, {rows * row, row, d, 1}, DeviceKind::cpu);
  };
  auto quantize = [&](std::int64_t first, std::int64_t rows, TensorView factors) {
    QuantizeArgs a;
    a.x = view(const_cast<HostTensor&>(x), first, rows);
    a.out = view(e4m3, first, rows);
    a.descale = factors;
    a.heads_kv = int(slots);
    a.per_tensor = per_tensor;
    a.per_block = per_block;
    flashattn::quantize_e4m3(a);
  };
  if (!varlen || per_tensor) {
    quantize(0, varlen ? x.shape()[0] : x.shape()[1], descale.view());
  } else {  // one call per sequence, each writing its row of factors
    std::int64_t first = 0;
    for (std::int64_t b = 0; b < sequences; ++b) {
      float* row = static_cast<float*>(descale.data()) + b * slots * (per_block ? blocks : 1);
      quantize(first, lens[b],
               per_block ? TensorView::strided(row, DType::f32, {1, slots, fp8_scale_blocks(lens[b])},
                                               {slots * blocks, blocks, 1}, DeviceKind::cpu)
                         : TensorView::strided(row, DType::f32, {1, slots}, {slots, 1}, DeviceKind::cpu));
      first += lens[b];
    }
  }
  HostTensor dequantized(DType::f32, x.shape());
  const std::int64_t row_elems = heads * d;
  std::vector<std::int64_t> sequence_of_row, first_row(lens.size(), 0);  // packed rows -> sequence, its first
  for (std::int64_t b = 0; b < std::int64_t(lens.size()); ++b) {
    first_row[std::size_t(b)] = std::int64_t(sequence_of_row.size());
    sequence_of_row.insert(sequence_of_row.end(), lens[b], b);
  }
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const std::int64_t row = i / row_elems, head = (i / d) % heads;
    const std::int64_t sequence = varlen ? sequence_of_row[std::size_t(row)] : row / x.shape()[1];
    const std::int64_t row_in_sequence = varlen ? row - first_row[std::size_t(sequence)] : row % x.shape()[1];
    const std::int64_t factor = per_tensor  ? 0
                                : per_block ? (sequence * slots + head / group) * blocks + row_in_sequence / kFp8ScaleBlockRows
                                            : sequence * slots + head / group;
    dequantized.set(i, e4m3.get(i) * descale.get(factor));
  }
  return dequantized;
}
}  // namespace

Fp8ForwardCheck check_forward_fp8(const Case& c, DType out_dtype, Fp8Scales scales, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  // f32 draws in a contiguous layout (the FP8 forward needs 16-byte strides).
  Case plain = c;
  plain.layout = Layout::bshd;
  HostTensor q = make_operand(plain, DType::f32, c.seqlen_q, c.heads_q, c.lens_q);
  HostTensor k = make_operand(plain, DType::f32, c.seqlen_k, c.heads_kv, c.lens_k);
  HostTensor v = make_operand(plain, DType::f32, c.seqlen_k, c.heads_kv, c.lens_k);
  for (HostTensor* t : {&q, &k, &v}) t->fill_normal(rng, c.magnitude);
  const int group = c.heads_q / c.heads_kv;
  HostTensor q8, k8, v8, q_descale, k_descale, v_descale;
  // V has no blocks: its factor scales the output once (flashattn/attention.hpp).
  const Fp8Scales v_scales = scales == Fp8Scales::per_block ? Fp8Scales::per_head : scales;
  const HostTensor qf = quantize_e4m3(q, c.lens_q, group, scales, q8, q_descale);
  const HostTensor kf = quantize_e4m3(k, c.lens_k, 1, scales, k8, k_descale);
  const HostTensor vf = quantize_e4m3(v, c.lens_k, 1, v_scales, v8, v_descale);
  HostTensor out = make_operand(plain, out_dtype, c.seqlen_q, c.heads_q, c.lens_q);
  HostTensor lse = make_lse(c);
  out.poison();
  lse.poison();
  HostTensor cu_q = make_offsets(c.lens_q), cu_k = make_offsets(c.lens_k), slopes;

  Operands ops(DeviceKind::cuda, {&q8, &k8, &v8, &out, &lse, &cu_q, &cu_k, &q_descale, &k_descale, &v_descale});
  ForwardArgs a;
  fill_options(a, plain, ops.view(5), ops.view(6), {});
  a.q = ops.view(0);
  a.k = ops.view(1);
  a.v = ops.view(2);
  a.out = ops.view(3);
  a.lse = ops.view(4);
  a.q_descale = ops.view(7);
  a.k_descale = ops.view(8);
  a.v_descale = ops.view(9);
  forward(a);
  ops.download({3, 4});

  HostTensor ref_out, ref_lse, abs_out, abs_lse;
  run_reference_forward(plain, qf, kf, vf, cu_q, cu_k, slopes, ref_out, ref_lse, std::nullopt);
  HostTensor v_abs = vf;
  for (std::int64_t i = 0; i < v_abs.numel(); ++i) v_abs.set(i, std::abs(vf.get(i)));
  run_reference_forward(plain, qf, kf, v_abs, cu_q, cu_k, slopes, abs_out, abs_lse, std::nullopt);

  Fp8ForwardCheck r;
  const auto got = out.to_floats(), ref = ref_out.to_floats(), weight = abs_out.to_floats();
  const double u = out_dtype == DType::bf16 ? 0x1p-8 : 0x1p-11;
  r.all_written = !any_nan(got);
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double bound = (0x1p-4 + 1e-3) * weight[i] + u * std::abs(double(ref[i]));
    const double err = std::abs(double(got[i]) - ref[i]);
    if (err == 0) continue;
    r.worst_ratio = std::max(r.worst_ratio, bound > 0 ? err / bound : INFINITY);
  }
  const auto ref_l = ref_lse.to_floats(), got_l = lse.to_floats();
  r.all_written = r.all_written && !any_nan(got_l);
  r.lse_error = max_lse_error(got_l, ref_l, r.masked_rows_ok);
  return r;
}

namespace {

struct BackwardRun {
  HostTensor dq, dk, dv;
};

// Inputs of a backward check, drawn from `seed`.
struct BackwardInputs {
  HostTensor q, k, v, dout, out, lse, cu_q, cu_k, slopes, state;
};

BackwardInputs make_backward_inputs(const Case& c, DType dtype, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  BackwardInputs in;
  in.q = make_operand(c, dtype, c.seqlen_q, c.heads_q, c.lens_q);
  in.k = make_operand(c, dtype, c.seqlen_k, c.heads_kv, c.lens_k);
  in.v = make_operand(c, dtype, c.seqlen_k, c.heads_kv, c.lens_k);
  in.dout = make_operand(c, dtype, c.seqlen_q, c.heads_q, c.lens_q);
  for (HostTensor* t : {&in.q, &in.k, &in.v, &in.dout}) {
    t->poison();
    t->fill_normal(rng, t == &in.dout ? 1.0f : c.magnitude);
  }
  in.cu_q = make_offsets(c.lens_q);
  in.cu_k = make_offsets(c.lens_k);
  in.slopes = make_slopes(c, rng);
  in.state = make_dropout_state(c);
  // out and LSE as a correct forward produces them: the reference, out rounded to dtype.
  HostTensor ref_out;
  run_reference_forward(c, in.q, in.k, in.v, in.cu_q, in.cu_k, in.slopes, ref_out, in.lse, std::nullopt);
  in.out = make_operand(c, dtype, c.seqlen_q, c.heads_q, c.lens_q);
  in.out.poison();
  for (std::int64_t i = 0; i < ref_out.numel(); ++i) in.out.set(i, ref_out.get(i));
  return in;
}

BackwardRun run_backward(const Case& c, DType dtype, DeviceKind device, BackwardInputs& in, bool deterministic) {
  BackwardRun r{make_operand(c, dtype, c.seqlen_q, c.heads_q, c.lens_q),
                make_operand(c, dtype, c.seqlen_k, c.heads_kv, c.lens_k),
                make_operand(c, dtype, c.seqlen_k, c.heads_kv, c.lens_k)};
  for (HostTensor* t : {&r.dq, &r.dk, &r.dv}) t->poison();
  Operands ops(device, {&in.q, &in.k, &in.v, &in.out, &in.dout, &in.lse, &r.dq, &r.dk, &r.dv, &in.cu_q, &in.cu_k,
                        &in.slopes, &in.state});
  BackwardArgs a;
  fill_options(a, c, ops.view(9), ops.view(10), ops.view(11), ops.view(12));
  a.q = ops.view(0);
  a.k = ops.view(1);
  a.v = ops.view(2);
  a.out = ops.view(3);
  a.dout = ops.view(4);
  a.lse = ops.view(5);
  a.dq = ops.view(6);
  a.dk = ops.view(7);
  a.dv = ops.view(8);
  a.deterministic = deterministic;
  backward(a);
  ops.download({6, 7, 8});
  return r;
}

// Reference gradients (f32) from f32 copies; with round_to, the same-precision baseline.
BackwardRun reference_gradients(const Case& c, BackwardInputs& in, std::optional<DType> round_to) {
  HostTensor q = in.q.to_f32(), k = in.k.to_f32(), v = in.v.to_f32(), dout = in.dout.to_f32(),
             out = in.out.to_f32();
  BackwardRun r{HostTensor(DType::f32, q.shape()), HostTensor(DType::f32, k.shape()),
                HostTensor(DType::f32, v.shape())};
  BackwardArgs a;
  fill_options(a, c, in.cu_q.view(), in.cu_k.view(), in.slopes.view());
  a.q = q.view();
  a.k = k.view();
  a.v = v.view();
  a.out = out.view();
  a.dout = dout.view();
  a.lse = in.lse.view();
  a.dq = r.dq.view();
  a.dk = r.dk.view();
  a.dv = r.dv.view();
  cpu::reference_backward(detail::make_backward_problem(a), round_to);
  return r;
}

}  // namespace

BackwardCheck check_backward(const Case& case_, DType dtype, DeviceKind device, std::uint64_t seed,
                             bool deterministic) {
  const Case c = with_dropout_stream(case_, seed);
  BackwardInputs in = make_backward_inputs(c, dtype, seed);
  BackwardRun got = run_backward(c, dtype, device, in, deterministic);
  BackwardRun ref = reference_gradients(c, in, std::nullopt);
  BackwardRun base = reference_gradients(c, in, dtype);
  BackwardCheck r;
  const HostTensor* gots[] = {&got.dq, &got.dk, &got.dv};
  const HostTensor* refs[] = {&ref.dq, &ref.dk, &ref.dv};
  const HostTensor* bases[] = {&base.dq, &base.dk, &base.dv};
  double* errors[] = {&r.dq_error, &r.dk_error, &r.dv_error};
  double* baselines[] = {&r.dq_baseline, &r.dk_baseline, &r.dv_baseline};
  for (int i = 0; i < 3; ++i) {
    const auto g = gots[i]->to_floats(), f = refs[i]->to_floats();
    *errors[i] = host::relative_error(g, f);
    *baselines[i] = host::relative_error(bases[i]->to_floats(), f);
    r.all_written = r.all_written && !any_nan(g);
    r.padding_untouched = r.padding_untouched && gots[i]->padding_untouched();
  }
  return r;
}

std::vector<bool> dropout_kept_entries(const Case& case_, DType dtype, DeviceKind device, std::uint64_t seed,
                                       bool reference) {
  const Case c = with_dropout_stream(case_, seed);
  HostTensor q = make_operand(c, dtype, c.seqlen_q, c.heads_q, c.lens_q);
  HostTensor k = make_operand(c, dtype, c.seqlen_k, c.heads_kv, c.lens_k);
  HostTensor v = make_operand(c, dtype, c.seqlen_k, c.heads_kv, c.lens_k);
  HostTensor out = make_operand(c, dtype, c.seqlen_q, c.heads_q, c.lens_q);
  if (c.seqlen_k > 3 * c.head_dim) throw std::invalid_argument("dropout_kept_entries: seqlen_k > 3 * head_dim");
  std::mt19937_64 rng(seed);
  k.fill_normal(rng, 1.0f);
  for (std::int64_t i = 0; i < q.numel(); ++i) q.set(i, 0.0f);
  // Logical (b, j, h, d) order: V[b, j, h, d] = 2^(j / head_dim) if d == j % head_dim: output
  // column d sums keys d, d + head_dim and d + 2 head_dim with weights 1, 2 and 4.
  for (std::int64_t i = 0; i < v.numel(); ++i) {
    const std::int64_t d = i % c.head_dim, j = (i / c.head_dim / c.heads_kv) % c.seqlen_k;
    v.set(i, d == j % c.head_dim ? float(1 << (j / c.head_dim)) : 0.0f);
  }
  out.poison();
  HostTensor lse = make_lse(c), cu_q = make_offsets(c.lens_q), cu_k = make_offsets(c.lens_k);
  HostTensor state = make_dropout_state(c);
  Operands ops(device, {&q, &k, &v, &out, &lse, &cu_q, &cu_k, &state});
  ForwardArgs a;
  fill_options(a, c, ops.view(5), ops.view(6), TensorView{}, ops.view(7));
  a.q = ops.view(0);
  a.k = ops.view(1);
  a.v = ops.view(2);
  a.out = ops.view(3);
  a.lse = ops.view(4);
  if (reference)
    reference::forward(a);
  else
    forward(a);
  ops.download({3, 4});
  // Every visible key of a row has the same probability 1 / n (q = 0), and the (undropped) LSE is
  // ln n: out[.., d] = (sum of the kept keys' weights) / ((1 - p) n), the weights' sum 0..7.
  std::vector<bool> kept(std::size_t(c.batch) * c.heads_q * c.seqlen_q * c.seqlen_k);
  for (int b = 0; b < c.batch; ++b)
    for (int i = 0; i < c.seqlen_q; ++i)
      for (int h = 0; h < c.heads_q; ++h) {
        const double row_lse = lse.get((std::int64_t(b) * c.heads_q + h) * c.seqlen_q + i);
        if (!(row_lse > -std::numeric_limits<double>::infinity())) continue;  // no visible key
        const double unit = 1.0 / ((1.0 - double(c.dropout_p)) * std::exp(row_lse));
        for (int j = 0; j < c.seqlen_k; ++j) {
          const std::int64_t e = ((std::int64_t(b) * c.seqlen_q + i) * c.heads_q + h) * c.head_dim + j % c.head_dim;
          const long weights = std::lround(out.get(e) / unit);
          kept[((std::size_t(b) * c.heads_q + h) * c.seqlen_q + i) * c.seqlen_k + j] = (weights >> (j / c.head_dim)) & 1;
        }
      }
  return kept;
}

bool backward_is_reproducible(const Case& case_, DType dtype, DeviceKind device, std::uint64_t seed,
                              bool deterministic) {
  const Case c = with_dropout_stream(case_, seed);
  BackwardInputs in = make_backward_inputs(c, dtype, seed);
  BackwardRun first = run_backward(c, dtype, device, in, deterministic);
  for (int attempt = 0; attempt < 3; ++attempt) {
    BackwardRun again = run_backward(c, dtype, device, in, deterministic);
    const std::pair<HostTensor*, HostTensor*> pairs[] = {
        {&first.dq, &again.dq}, {&first.dk, &again.dk}, {&first.dv, &again.dv}};
    for (auto [a, b] : pairs)
      if (a->storage_bytes() != b->storage_bytes() ||
          std::memcmp(a->data(), b->data(), a->storage_bytes()) != 0)
        return false;
  }
  return true;
}

}  // namespace flashattn::testing
