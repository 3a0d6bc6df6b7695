// KV caches and paged K/V: validation of flashattn/kv_cache.hpp's call and of ForwardArgs'
// block_table / seqused_k, and the KV-cache call itself (append + rotary, then the attention).
//
// The attention part reuses make_forward_problem on a logical view of the cache, (batch,
// capacity, heads_kv, head_dim), then points the problem's K/V at the real storage and fills
// problem.kv (common/kv_layout.hpp). Errors the shared checks raise about "k"/"v" are renamed to
// the caller's argument names.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "api/kv_cache.hpp"
#include "api/validate.hpp"
#include "cpu/backend.hpp"
#include "cpu/kv_append.hpp"
#include "flashattn/error.hpp"
#include "flashattn/kv_cache.hpp"

namespace flashattn::detail {
namespace {

constexpr int kMinPage = 16, kMaxPage = 512, kPageMultiple = 16;

std::string str(std::int64_t x) { return std::to_string(x); }

std::string shape_string(const TensorView& t) {
  std::string s = "[";
  for (int i = 0; i < t.rank; ++i) s += (i ? ", " : "") + str(t.shape[i]);
  return s + "]";
}

[[noreturn]] void fail(const std::string& arg, const std::string& expected, const std::string& given,
                       ErrorKind kind = ErrorKind::invalid_argument) {
  throw Error(kind, arg, expected, given);
}

void check_placement(const std::string& name, const TensorView& t, const TensorView& q) {
  if (t.device != q.device || t.device_index != q.device_index)
    fail(name + ".device", std::string("the device of q (") + to_string(q.device) + ":" + str(q.device_index) + ")",
         std::string(to_string(t.device)) + ":" + str(t.device_index), ErrorKind::invalid_type);
}

// A tensor of `rank` dimensions and `dtype`, on q's device, sizes non-negative, last dimension
// contiguous.
void check_basic(const std::string& name, const TensorView& t, int rank, DType dtype, const TensorView& q) {
  if (!t.present()) fail(name, "a tensor", "none");
  if (t.rank != rank) fail(name, str(rank) + " dimensions", str(t.rank) + " (shape " + shape_string(t) + ")");
  if (t.dtype != dtype) fail(name + ".dtype", to_string(dtype), to_string(t.dtype), ErrorKind::invalid_type);
  check_placement(name, t, q);
  for (int i = 0; i < rank; ++i) {
    if (t.shape[i] < 0 || t.shape[i] > INT32_MAX) fail(name + ".shape", "sizes in [0, 2^31)", shape_string(t));
    if (t.stride[i] < 0) fail(name + ".stride[" + str(i) + "]", "a non-negative stride", str(t.stride[i]));
  }
  if (t.shape[rank - 1] > 1 && t.stride[rank - 1] != 1)
    fail(name + ".stride[" + str(rank - 1) + "]", "1 (the last dimension contiguous)", str(t.stride[rank - 1]));
  if (t.numel() > 0 && t.data == nullptr) fail(name + ".data", "a non-null pointer", "null");
}

// A (batch,) int32 vector.
void check_per_sequence(const std::string& name, const TensorView& t, std::int64_t batch, const TensorView& q) {
  check_basic(name, t, 1, DType::i32, q);
  if (t.shape[0] != batch) fail(name + ".shape", "[" + str(batch) + "] (batch)", shape_string(t));
}

std::int32_t entry(const TensorView& t, std::int64_t i) { return static_cast<const std::int32_t*>(t.data)[i * t.stride[0]]; }
std::int32_t entry(const TensorView& t, std::int64_t i, std::int64_t j) {
  return static_cast<const std::int32_t*>(t.data)[i * t.stride[0] + j * t.stride[1]];
}

// The page geometry of a paged K/V pair and block_table; returns the pages.
KvPages check_pages(const TensorView& k, const TensorView& v, const TensorView& table, std::int64_t batch,
                    const TensorView& q, const char* k_name, const char* v_name) {
  check_basic("block_table", table, 2, DType::i32, q);
  if (table.shape[0] != batch)
    fail("block_table.shape[0]", str(batch) + " (batch)", str(table.shape[0]));
  if (k.rank != 4)
    fail(k_name, "4 dimensions (num_blocks, page_size, heads_kv, head_dim) with block_table", str(k.rank));
  if (v.rank != 4 || v.shape != k.shape)
    fail(std::string(v_name) + ".shape", std::string("the shape of ") + k_name + " " + shape_string(k), shape_string(v));
  const std::int64_t page = k.shape[1];
  if (page < kMinPage || page > kMaxPage || page % kPageMultiple != 0)
    fail(std::string(k_name) + ".shape[1] (page_size)",
         "a multiple of " + str(kPageMultiple) + " from " + str(kMinPage) + " to " + str(kMaxPage), str(page));
  if (table.shape[1] * page > INT32_MAX)
    fail("block_table.shape[1]", "max_blocks * page_size below 2^31", str(table.shape[1]) + " * " + str(page));
  if (k.shape[0] > INT32_MAX) fail(std::string(k_name) + ".shape[0] (num_blocks)", "below 2^31", str(k.shape[0]));
  return {static_cast<const std::int32_t*>(table.data), table.stride[0], int(page), int(table.shape[1]),
          int(k.shape[0])};
}

// CPU contents of block_table: the pages holding rows [0, rows) of sequence b exist.
void check_table_rows(const TensorView& table, std::int64_t b, std::int64_t rows, int page_size,
                      std::int64_t num_blocks) {
  const std::int64_t capacity = table.shape[1] * page_size;
  if (rows > capacity)
    fail("cache_seqlens[" + str(b) + "]",
         "keys that fit the pages of block_table (max_blocks " + str(table.shape[1]) + " * page_size " +
             str(page_size) + " = " + str(capacity) + " rows)",
         str(rows) + " rows");
  for (std::int64_t i = 0; i < (rows + page_size - 1) / page_size; ++i) {
    const std::int32_t page = entry(table, b, i);
    if (page < 0 || page >= num_blocks)
      fail("block_table[" + str(b) + "][" + str(i) + "]", "a page index in [0, " + str(num_blocks) + ")",
           str(page));
  }
}

// A view with the same pointer and inner strides, as make_forward_problem should see it.
TensorView logical(const TensorView& t, std::initializer_list<std::int64_t> shape,
                   std::initializer_list<std::int64_t> stride) {
  TensorView l = TensorView::strided(t.data, t.dtype, shape, stride, t.device, t.device_index);
  return l;
}

// Runs `build`, renaming errors about "k..."/"v..." to the caller's names.
template <class Build>
ForwardProblem renamed(Build&& build, const std::string& k_name, const std::string& v_name) {
  try {
    return build();
  } catch (const Error& e) {
    const std::string& a = e.argument();
    auto rename = [&](const std::string& from, const std::string& to) -> std::string {
      if (a == from || a.rfind(from + ".", 0) == 0) return to + a.substr(from.size());
      return {};
    };
    std::string name = rename("k", k_name);
    if (name.empty()) name = rename("v", v_name);
    if (name.empty()) throw;
    throw Error(e.kind(), name, e.expected(), e.given());
  }
}

SeqTensor seq_of(const TensorView& t) { return {t.data, t.stride[0], t.stride[1], t.stride[2]}; }

}  // namespace

ForwardProblem make_paged_forward_problem(const ForwardArgs& a) {
  const TensorView& q = a.q;
  if (!a.cu_seqlens_q.present())
    fail(a.block_table.present() ? "block_table" : "seqused_k",
         "a variable-length call (cu_seqlens_q and cu_seqlens_k); use forward_kvcache for fixed-length caches",
         "a fixed-length call");
  if (!q.present()) fail("q", "a tensor", "none");
  if (q.dtype == DType::e4m3)
    fail("q.dtype", "f16 or bf16 with paged K/V or seqused_k (the FP8 forward reads contiguous K/V)", "e4m3",
         ErrorKind::unsupported);
  const std::int64_t batch = a.cu_seqlens_q.present() ? a.cu_seqlens_q.shape[0] - 1 : 0;
  const bool paged = a.block_table.present();
  KvMap kv;
  ForwardArgs plain = a;
  plain.block_table = {};
  plain.seqused_k = {};
  if (paged) {
    kv.pages = check_pages(a.k, a.v, a.block_table, batch, q, "k", "v");
    // The shared checks see K/V as packed rows (their extent is the pages', unknown here).
    plain.k = logical(a.k, {INT32_MAX, a.k.shape[2], a.k.shape[3]}, {a.k.stride[1], a.k.stride[2], 1});
    plain.v = logical(a.v, {INT32_MAX, a.v.shape[2], a.v.shape[3]}, {a.v.stride[1], a.v.stride[2], 1});
  }
  if (a.seqused_k.present()) {
    check_per_sequence("seqused_k", a.seqused_k, batch, q);
    kv.seqused_k = static_cast<const std::int32_t*>(a.seqused_k.data);
  }
  ForwardProblem p = make_forward_problem(plain);
  if (paged) {
    p.k = seq_of(a.k);
    p.v = seq_of(a.v);
    p.total_k = 0;
  }
  p.kv = kv;
  if (q.device == DeviceKind::cpu) {
    for (std::int64_t b = 0; b < batch; ++b) {
      const std::int32_t k0 = entry(a.cu_seqlens_k, b), k1 = entry(a.cu_seqlens_k, b + 1);
      std::int64_t rows = k1 - k0;
      if (a.seqused_k.present()) {
        const std::int32_t used = entry(a.seqused_k, b);
        const std::int64_t limit = paged ? std::int64_t(a.max_seqlen_k) : std::min<std::int64_t>(rows, a.max_seqlen_k);
        if (used < 0 || used > limit)
          fail("seqused_k[" + str(b) + "]",
               "a length in [0, " + str(limit) + "] (" + (paged ? "max_seqlen_k" : "the sequence's cu_seqlens_k length") + ")",
               str(used));
        rows = used;
      }
      if (paged) check_table_rows(a.block_table, b, rows, kv.pages.page_size, a.k.shape[0]);
    }
  }
  return p;
}

KvCachePlan make_kvcache_plan(const KvCacheArgs& a) {
  const TensorView& q = a.q;
  if (!q.present()) fail("q", "a tensor", "none");
  if (q.rank != 4) fail("q", "4 dimensions (batch, seqlen_q, heads_q, head_dim)", str(q.rank));
  if (q.dtype == DType::e4m3)
    fail("q.dtype", "f16 or bf16 in the KV-cache call (the FP8 forward reads contiguous K/V)", "e4m3",
         ErrorKind::unsupported);
  const std::int64_t batch = q.shape[0], seqlen_q = q.shape[1], head_dim = q.shape[3];
  const bool paged = a.block_table.present();

  // The cache.
  check_basic("k_cache", a.k_cache, 4, q.dtype, q);
  check_basic("v_cache", a.v_cache, 4, q.dtype, q);
  if (a.v_cache.shape != a.k_cache.shape)
    fail("v_cache.shape", "the shape of k_cache " + shape_string(a.k_cache), shape_string(a.v_cache));
  const std::int64_t heads_kv = a.k_cache.shape[2];
  KvMap kv;
  std::int64_t capacity = 0;
  if (paged) {
    kv.pages = check_pages(a.k_cache, a.v_cache, a.block_table, batch, q, "k_cache", "v_cache");
    capacity = std::int64_t(kv.pages.max_blocks) * kv.pages.page_size;
    if (a.cache_batch_idx.present())
      fail("cache_batch_idx", "none with a paged cache (block_table already names each sequence's pages)",
           "a tensor");
  } else {
    capacity = a.k_cache.shape[1];
    if (!a.cache_batch_idx.present() && a.k_cache.shape[0] != batch)
      fail("k_cache.shape[0] (batch_cache)", str(batch) + " (the batch of q; or pass cache_batch_idx)",
           str(a.k_cache.shape[0]));
  }
  if (a.cache_seqlens.present()) {
    check_per_sequence("cache_seqlens", a.cache_seqlens, batch, q);
    kv.seqused_k = static_cast<const std::int32_t*>(a.cache_seqlens.data);
  }
  if (a.cache_batch_idx.present()) {
    check_per_sequence("cache_batch_idx", a.cache_batch_idx, batch, q);
    kv.batch_index = static_cast<const std::int32_t*>(a.cache_batch_idx.data);
  }
  if (a.cache_leftpad.present()) {
    check_per_sequence("cache_leftpad", a.cache_leftpad, batch, q);
    kv.k_start = static_cast<const std::int32_t*>(a.cache_leftpad.data);
  }

  // New rows.
  KvAppend app;
  if (a.k_new.present() != a.v_new.present())
    fail(a.k_new.present() ? "v" : "k", "k and v both given (new rows to append) or both absent", "only one");
  std::int64_t seqlen_new = 0;
  if (a.k_new.present()) {
    for (auto [name, t] : {std::pair<const char*, const TensorView*>{"k", &a.k_new}, {"v", &a.v_new}}) {
      check_basic(name, *t, 4, q.dtype, q);
      if (t->shape[0] != batch || t->shape[2] != heads_kv || t->shape[3] != head_dim)
        fail(std::string(name) + ".shape",
             "(batch, seqlen_new, heads_kv, head_dim) = [" + str(batch) + ", *, " + str(heads_kv) + ", " +
                 str(head_dim) + "]",
             shape_string(*t));
    }
    if (a.v_new.shape[1] != a.k_new.shape[1])
      fail("v.shape[1] (seqlen_new)", "the seqlen of k (" + str(a.k_new.shape[1]) + ")", str(a.v_new.shape[1]));
    if (!a.cache_seqlens.present())
      fail("cache_seqlens", "a tensor when appending k and v (where the new rows go)", "none");
    seqlen_new = a.k_new.shape[1];
    app.k_new = seq_of(a.k_new);
    app.v_new = seq_of(a.v_new);
    app.seqlen_new = int(seqlen_new);
    app.cache_seqlens = kv.seqused_k;
    kv.appended = int(seqlen_new);
  }

  // Rotary.
  if (a.rotary_cos.present() != a.rotary_sin.present())
    fail(a.rotary_cos.present() ? "rotary_sin" : "rotary_cos", "rotary_cos and rotary_sin both given or both absent",
         "only one");
  const bool local = a.causal || a.window_left >= 0 || a.window_right >= 0;
  if (a.rotary_cos.present()) {
    check_basic("rotary_cos", a.rotary_cos, 2, q.dtype, q);
    check_basic("rotary_sin", a.rotary_sin, 2, q.dtype, q);
    if (a.rotary_sin.shape != a.rotary_cos.shape)
      fail("rotary_sin.shape", "the shape of rotary_cos " + shape_string(a.rotary_cos), shape_string(a.rotary_sin));
    const std::int64_t rotary_dim = 2 * a.rotary_cos.shape[1];
    if (rotary_dim < 2 || rotary_dim > head_dim)
      fail("rotary_cos.shape[1] (rotary_dim / 2)", "1 to head_dim / 2 (" + str(head_dim / 2) + ")",
           str(a.rotary_cos.shape[1]));
    if (a.rotary_cos.shape[0] < capacity)
      fail("rotary_cos.shape[0] (seqlen_ro)", "at least the cache's rows (" + str(capacity) + ")",
           str(a.rotary_cos.shape[0]));
    if (!a.k_new.present()) fail("k", "new keys to rotate and append when rotary_cos/rotary_sin are given", "none");
    app.cos = a.rotary_cos.data;
    app.sin = a.rotary_sin.data;
    app.cos_stride = a.rotary_cos.stride[0];
    app.sin_stride = a.rotary_sin.stride[0];
    app.rotary_dim = int(rotary_dim);
    app.interleaved = a.rotary_interleaved;
    app.query_positions_by_row = local;
  }
  if (a.num_splits < 0) fail("num_splits", ">= 0 (0 = the library's heuristic)", str(a.num_splits));

  // The attention over the cache, as a fixed-length call on a logical (batch, capacity) view.
  ForwardArgs f;
  f.softmax_scale = a.softmax_scale;
  f.causal = a.causal;
  f.window_left = a.window_left;
  f.window_right = a.window_right;
  f.softcap = a.softcap;
  // ALiBi: the shared checks and the bias of every backend (common/alibi.hpp) see the sequence's
  // key range [cache_leftpad, cache_seqlens + seqlen_new) as its keys (problem.kv), which is
  // flash-attn's KV-cache bias.
  f.alibi_slopes = a.alibi_slopes;
  f.stream = a.stream;
  f.q = q;
  f.out = a.out;
  f.lse = a.lse;
  const TensorView& kc = a.k_cache;
  const TensorView& vc = a.v_cache;
  f.k = logical(kc, {batch, capacity, kc.shape[2], kc.shape[3]}, {kc.stride[0], kc.stride[1], kc.stride[2], 1});
  f.v = logical(vc, {batch, capacity, vc.shape[2], vc.shape[3]}, {vc.stride[0], vc.stride[1], vc.stride[2], 1});
  KvCachePlan plan;
  plan.problem = renamed([&] { return make_forward_problem(f); }, "k_cache", "v_cache");
  plan.problem.k = seq_of(kc);
  plan.problem.v = seq_of(vc);
  plan.problem.kv = kv;
  plan.problem.num_splits = a.num_splits;
  plan.append = app;

  // CPU contents: every index in range, the append fits, rotary positions exist.
  if (q.device == DeviceKind::cpu) {
    const std::int64_t batch_cache = paged ? 0 : kc.shape[0];
    std::vector<char> used(std::size_t(batch_cache), 0);
    for (std::int64_t b = 0; b < batch; ++b) {
      const std::int64_t before = a.cache_seqlens.present() ? entry(a.cache_seqlens, b) : capacity;
      const std::int64_t after = before + seqlen_new;
      if (before < 0) fail("cache_seqlens[" + str(b) + "]", "a non-negative length", str(before));
      if (paged) {
        check_table_rows(a.block_table, b, after, kv.pages.page_size, kc.shape[0]);
      } else if (after > capacity) {
        fail("cache_seqlens[" + str(b) + "]",
             seqlen_new ? "room for the " + str(seqlen_new) + " appended rows in the cache (<= seqlen_cache " +
                              str(capacity) + " - " + str(seqlen_new) + ")"
                        : "a length within the cache (<= seqlen_cache " + str(capacity) + ")",
             str(before));
      }
      if (a.cache_leftpad.present()) {
        const std::int32_t pad = entry(a.cache_leftpad, b);
        if (pad < 0 || pad > before)
          fail("cache_leftpad[" + str(b) + "]", "a row in [0, cache_seqlens[b] = " + str(before) + "]", str(pad));
      }
      if (a.cache_batch_idx.present()) {
        const std::int32_t idx = entry(a.cache_batch_idx, b);
        if (idx < 0 || idx >= batch_cache)
          fail("cache_batch_idx[" + str(b) + "]", "a cache batch in [0, " + str(batch_cache) + ")", str(idx));
        if (seqlen_new > 0 && used[idx]++)
          fail("cache_batch_idx[" + str(b) + "]", "distinct cache batches when appending", str(idx) + " again");
      }
      if (app.rotates() && seqlen_q > 0) {
        const std::int64_t last = before + (local ? seqlen_q - 1 : 0);
        if (last >= a.rotary_cos.shape[0])
          fail("rotary_cos.shape[0] (seqlen_ro)",
               "a position for every query (sequence " + str(b) + " reaches " + str(last) + ")",
               str(a.rotary_cos.shape[0]));
      }
    }
  }
  return plan;
}

void run_kvcache_cpu(KvCachePlan& plan, bool reference) {
  ForwardProblem& p = plan.problem;
  cpu::append_kv(p, plan.append);
  std::vector<unsigned char> rotated;
  if (plan.append.rotates()) {
    rotated.resize(std::size_t(p.batch) * p.seqlen_q * p.heads_q * p.head_dim * element_size(p.dtype));
    cpu::rotate_queries(p, plan.append, rotated.data());
    p.q = {rotated.data(), std::int64_t(p.seqlen_q) * p.heads_q * p.head_dim, std::int64_t(p.heads_q) * p.head_dim,
           p.head_dim};
  }
  if (reference)
    cpu::reference_forward(p);
  else
    cpu::forward(p);
}

}  // namespace flashattn::detail
