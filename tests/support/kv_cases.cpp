#include "kv_cases.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>

#include "api/validate.hpp"
#include "cpu/backend.hpp"
#include "device_buffer.hpp"
#include "flashattn/kv_cache.hpp"
#include "harness.hpp"
#include "host_tensor.hpp"

namespace flashattn::testing {

std::vector<KvCase> kv_cases() {
  std::vector<KvCase> t;
  {
    KvCase c;
    c.name = "decode_contiguous";
    c.cache_seqlens = {17, 250};
    t.push_back(c);
    c.name = "decode_paged16_gqa4";
    c.heads_q = 8;
    c.page_size = 16;
    c.cache_rows = 320;
    c.cache_seqlens = {1, 300};
    t.push_back(c);
    c.name = "decode_empty_cache";  // a sequence that sees no key: out 0, LSE -inf
    c.page_size = 0;
    c.cache_seqlens = {0, 5};
    t.push_back(c);
  }
  {
    KvCase c;
    c.name = "append_rotary_paged16_causal";
    c.page_size = 16;
    c.cache_rows = 256;
    c.cache_seqlens = {0, 200};
    c.seqlen_q = c.seqlen_new = 3;
    c.rotary_dim = 32;
    c.causal = true;
    t.push_back(c);
    c.name = "append_rotary_interleaved_noncausal";
    c.page_size = 0;
    c.cache_rows = 100;
    c.cache_seqlens = {10, 97};
    c.seqlen_q = 4;
    c.seqlen_new = 2;
    c.rotary_dim = 64;
    c.interleaved = true;
    c.causal = false;
    t.push_back(c);
  }
  {
    KvCase c;
    c.name = "append_leftpad_batch_idx_causal";
    c.batch_idx = true;
    c.leftpad = {3, 0};
    c.cache_seqlens = {40, 7};
    c.seqlen_new = 1;
    c.rotary_dim = 16;
    c.causal = true;
    t.push_back(c);
  }
  {
    KvCase c;
    c.name = "speculative_paged256_window_softcap";
    c.page_size = 256;
    c.cache_rows = 512;
    c.cache_seqlens = {100, 400};
    c.seqlen_q = c.seqlen_new = 5;
    c.window_left = 32;
    c.window_right = 0;
    c.softcap = 5.0f;
    t.push_back(c);
  }
  {
    KvCase c;
    c.name = "chunked_prefill_paged48_mqa_hd128";
    c.batch = 3;
    c.heads_q = 6;
    c.heads_kv = 1;
    c.head_dim = 128;
    c.page_size = 48;
    c.cache_rows = 192;
    c.cache_seqlens = {0, 37, 128};
    c.seqlen_q = c.seqlen_new = 64;
    c.causal = true;
    c.rotary_dim = 64;
    t.push_back(c);
  }
  // The append + rotary that the sm80 decode kernel does itself (cuda/sm80/fused_append.cuh):
  // the CTAs of a sequence write the new rows they read, those of its last split all of them
  // (forced split counts and the heuristic's), query rows rotated as they load, with and without
  // rotary, a head dim below the kernel width, new rows that no query sees (they are written all
  // the same); and above kFusedAppendMaxRows (16) new rows on the decode tile, where the append
  // kernel runs first.
  {
    KvCase c;
    c.name = "append_rotary_gqa4_splits4_causal";
    c.heads_q = 8;
    c.cache_rows = 1100;
    c.cache_seqlens = {1000, 389};
    c.seqlen_q = c.seqlen_new = 4;
    c.rotary_dim = 64;
    c.causal = true;
    c.num_splits = 4;
    t.push_back(c);
    c.name = "append_rotary_paged16_hd128_leftpad_splits3";
    c.head_dim = 128;
    c.page_size = 16;
    c.cache_rows = 640;
    c.cache_seqlens = {600, 150};
    c.leftpad = {5, 0};
    c.seqlen_q = c.seqlen_new = 1;
    c.rotary_dim = 128;
    c.num_splits = 3;
    t.push_back(c);
    c.name = "append_rotary_interleaved_hd80_gqa4";
    c.head_dim = 80;
    c.page_size = 0;
    c.cache_rows = 300;
    c.cache_seqlens = {100, 251};
    c.leftpad = {};
    c.rotary_dim = 32;
    c.interleaved = true;
    c.causal = false;
    c.num_splits = 0;
    t.push_back(c);
    c.name = "append_no_rotary_splits2";
    c.head_dim = 64;
    c.seqlen_new = 2;
    c.rotary_dim = 0;
    c.interleaved = false;
    c.num_splits = 2;
    t.push_back(c);
    c.name = "append_rotary_window_unseen_rows_splits2";  // the query sees 3 of the 6 new rows
    c.seqlen_new = 6;
    c.rotary_dim = 16;
    c.causal = true;
    c.window_left = 2;
    t.push_back(c);
    c.name = "append_rotary_17_rows_decode_causal";  // one more than the fused path takes
    c.seqlen_new = 17;
    c.window_left = -1;
    c.num_splits = 0;
    t.push_back(c);
    // d = 256, 100 query rows of one head a tile: the sm80 family's short-prefill tile (the decode
    // kernel), two query blocks, each writing the new rows.
    c.name = "append_rotary_hd256_two_query_blocks_causal";
    c.heads_q = 2;
    c.head_dim = 256;
    c.cache_seqlens = {100, 180};
    c.seqlen_q = 100;
    c.seqlen_new = 8;
    c.rotary_dim = 64;
    t.push_back(c);
    // New rows across the two splits' key ranges (tiles of 128 keys up to d = 128, 64 above):
    // a CTA of the first split writes the new rows among its own keys and reads them back, the
    // last split's writes all of them.
    c.name = "append_rotary_rows_across_splits2_causal";
    c.batch = 3;
    c.heads_q = 4;
    c.head_dim = 64;
    c.cache_rows = 300;
    c.cache_seqlens = {60, 124, 252};
    c.seqlen_q = 1;
    c.seqlen_new = 8;
    c.rotary_dim = 32;
    c.num_splits = 2;
    t.push_back(c);
    c.name = "append_rotary_rows_across_splits2_hd256_causal";
    c.head_dim = 256;
    t.push_back(c);
  }
  // Paged rows at head dims below the kernel width, not 16-byte aligned (d = 59: rows move element
  // by element) and aligned (d = 80): the paged loads go through the same column rule as the
  // contiguous ones (flash-attn's suite faulted here at 967cd46, on an H100, 2026-11-26).
  for (int d : {59, 80}) {
    KvCase c;
    c.name = "prefill_paged16_hd" + std::to_string(d) + "_causal";
    c.head_dim = d;
    c.page_size = 16;
    c.cache_rows = 160;
    c.cache_seqlens = {30, 140};
    c.seqlen_q = c.seqlen_new = 17;
    c.causal = true;
    t.push_back(c);
  }
  // Pages against the key tile (the sm80 decode tile holds 128 keys, the prefill tile 64; a
  // thread's rows are 16 apart, 32 at d = 96): pages as large as the tile, larger, smaller; tiles
  // that start inside a page (cache_leftpad), so that a tile spans one page more; sequences that
  // end inside a page. The kernel takes different address paths for a tile within one page, for
  // pages of 16 rows (or of a thread's row step) and for the rest (cuda/sm80/paged_tiles.cuh).
  {
    KvCase c;
    c.heads_q = 8;
    c.name = "decode_paged128_gqa4";  // pages of one decode tile
    c.page_size = 128;
    c.cache_rows = 512;
    c.cache_seqlens = {129, 383};
    t.push_back(c);
    c.name = "decode_paged16_leftpad_gqa4";  // 128-key tiles over 9 pages of 16
    c.page_size = 16;
    c.cache_rows = 320;
    c.cache_seqlens = {200, 290};
    c.leftpad = {3, 13};
    t.push_back(c);
    c.name = "decode_paged512_leftpad_gqa4";  // a tile across the boundary of two large pages
    c.page_size = 512;
    c.cache_rows = 1024;
    c.cache_seqlens = {700, 1000};
    c.leftpad = {100, 0};
    t.push_back(c);
    c.name = "decode_paged80_gqa4";  // pages that neither divide nor are divided by the tile
    c.page_size = 80;
    c.cache_rows = 400;
    c.cache_seqlens = {333, 17};
    c.leftpad = {};
    t.push_back(c);
  }
  {
    // One split over many key tiles: each CTA runs nine or ten tiles, so that every tile's rows are
    // found from page entries fetched a tile ahead into alternating slot sets (sm80/paged_tiles.cuh),
    // over shuffled pages; a stale or early entry reads the wrong page.
    KvCase c;
    c.heads_q = 8;
    c.num_splits = 1;
    c.cache_rows = 1296;  // 81 pages of 16, 27 of 48
    c.cache_seqlens = {1221, 1100};
    c.leftpad = {5, 0};
    for (int d : {64, 128}) {
      c.head_dim = d;
      c.page_size = 0;
      c.name = "decode_contiguous_one_split_many_tiles_hd" + std::to_string(d);
      t.push_back(c);
      c.page_size = 16;
      c.name = "decode_paged16_one_split_many_tiles_hd" + std::to_string(d);
      t.push_back(c);
      c.page_size = 48;
      c.name = "decode_paged48_one_split_many_tiles_hd" + std::to_string(d);
      t.push_back(c);
    }
  }
  for (int page : {16, 32}) {  // d = 96: a thread's rows are 32 apart (two pages of 16, one of 32)
    KvCase c;
    c.name = "decode_paged" + std::to_string(page) + "_hd96_leftpad";
    c.head_dim = 96;
    c.page_size = page;
    c.cache_rows = 320;
    c.cache_seqlens = {301, 150};
    c.leftpad = {0, 7};
    t.push_back(c);
  }
  {
    KvCase c;
    c.name = "chunked_prefill_paged64_leftpad_causal";  // pages of one prefill tile, tiles inside pages
    c.page_size = 64;
    c.cache_rows = 256;
    c.cache_seqlens = {100, 190};
    c.leftpad = {5, 0};
    c.seqlen_q = 64;
    c.causal = true;
    t.push_back(c);
  }
  // ALiBi (common/alibi.hpp) over a cache: the distance counts from the sequence's last key,
  // cache_seqlens + seqlen_new, whatever cache_leftpad and the pages; slopes per query head or
  // per (sequence, query head), the latter indexed by the sequence, not its cache batch. Decoding
  // packs a GQA group's query heads into one tile (each row its own slope) and splits the keys
  // (the heuristic, and forced counts); prefill tiles; every kernel width; a row that sees no key.
  {
    KvCase c;
    c.alibi = Alibi::heads;
    c.name = "alibi_decode_contiguous";
    c.cache_seqlens = {17, 250};
    t.push_back(c);
    c.name = "alibi_decode_contiguous_splits3";
    c.cache_rows = 1100;
    c.cache_seqlens = {1000, 389};
    c.num_splits = 3;
    t.push_back(c);
    c.name = "alibi_batch_decode_paged16_leftpad_gqa4_splits5";
    c.alibi = Alibi::batch_heads;
    c.heads_q = 8;
    c.page_size = 16;
    c.cache_rows = 1024;
    c.cache_seqlens = {900, 517};
    c.leftpad = {37, 0};
    c.num_splits = 5;
    t.push_back(c);
    c.name = "alibi_batch_decode_paged256_leftpad_gqa4_causal";  // the heuristic's splits
    c.page_size = 256;
    c.cache_seqlens = {1000, 300};
    c.leftpad = {0, 129};
    c.num_splits = 0;
    c.causal = true;
    t.push_back(c);
    c.name = "alibi_decode_empty_cache";  // sequence 0 sees no key: out 0, LSE -inf
    c.alibi = Alibi::heads;
    c.page_size = 0;
    c.cache_rows = 300;
    c.cache_seqlens = {0, 5};
    c.leftpad = {};
    c.causal = false;
    t.push_back(c);
  }
  {
    KvCase c;
    c.alibi = Alibi::batch_heads;
    c.name = "alibi_batch_append_rotary_paged16_causal";
    c.page_size = 16;
    c.cache_rows = 256;
    c.cache_seqlens = {0, 200};
    c.seqlen_q = c.seqlen_new = 3;
    c.rotary_dim = 32;
    c.causal = true;
    t.push_back(c);
    c.name = "alibi_append_rotary_interleaved_noncausal";  // seqlen_q != seqlen_new
    c.alibi = Alibi::heads;
    c.page_size = 0;
    c.cache_rows = 100;
    c.cache_seqlens = {10, 97};
    c.seqlen_q = 4;
    c.seqlen_new = 2;
    c.rotary_dim = 64;
    c.interleaved = true;
    c.causal = false;
    t.push_back(c);
    c.name = "alibi_batch_append_leftpad_batch_idx";  // slopes by sequence, K/V from permuted cache batches
    c.alibi = Alibi::batch_heads;
    c.batch = 3;
    c.batch_idx = true;
    c.leftpad = {3, 0, 11};
    c.cache_seqlens = {40, 7, 60};
    c.seqlen_q = 2;
    c.seqlen_new = 1;
    c.rotary_dim = 16;
    c.interleaved = false;
    t.push_back(c);
    c.name = "alibi_batch_append_leftpad_batch_idx_causal";
    c.causal = true;
    t.push_back(c);
  }
  {
    KvCase c;
    c.alibi = Alibi::heads;
    c.name = "alibi_speculative_paged256_window_softcap";
    c.page_size = 256;
    c.cache_rows = 512;
    c.cache_seqlens = {100, 400};
    c.seqlen_q = c.seqlen_new = 5;
    c.window_left = 32;
    c.window_right = 0;
    c.softcap = 5.0f;
    t.push_back(c);
    c.name = "alibi_speculative_window_noncausal_leftpad";  // a two-sided window
    c.page_size = 0;
    c.cache_rows = 300;
    c.cache_seqlens = {250, 60};
    c.leftpad = {200, 9};
    c.seqlen_q = 5;
    c.seqlen_new = 0;
    c.window_left = 7;
    c.window_right = 2;
    c.softcap = 0.0f;
    t.push_back(c);
    // Causal with more queries than keys (leftpad leaves sequence 0 two keys): its first three
    // rows see no key.
    c.name = "alibi_batch_masked_rows_leftpad_causal";
    c.alibi = Alibi::batch_heads;
    c.cache_seqlens = {10, 60};
    c.leftpad = {8, 0};
    c.window_left = c.window_right = -1;
    c.causal = true;
    t.push_back(c);
  }
  {
    KvCase c;
    c.alibi = Alibi::heads;
    c.name = "alibi_chunked_prefill_paged48_mqa_hd128";
    c.batch = 3;
    c.heads_q = 6;
    c.heads_kv = 1;
    c.head_dim = 128;
    c.page_size = 48;
    c.cache_rows = 192;
    c.cache_seqlens = {0, 37, 128};
    c.seqlen_q = c.seqlen_new = 64;
    c.causal = true;
    c.rotary_dim = 64;
    t.push_back(c);
    c.name = "alibi_batch_prefill_paged64_leftpad_hd128";
    c.alibi = Alibi::batch_heads;
    c.batch = 2;
    c.heads_q = 4;
    c.heads_kv = 2;
    c.page_size = 64;
    c.cache_rows = 256;
    c.cache_seqlens = {100, 190};
    c.leftpad = {5, 0};
    c.seqlen_q = 33;
    c.seqlen_new = 0;
    c.rotary_dim = 0;
    c.causal = false;
    t.push_back(c);
  }
  // Every kernel width, and head dims between them (d = 59: rows move element by element).
  for (int d : {32, 59, 96, 192, 256}) {
    KvCase c;
    c.alibi = d % 2 ? Alibi::batch_heads : Alibi::heads;
    c.name = "alibi_decode_paged16_gqa4_hd" + std::to_string(d);
    c.heads_q = 8;
    c.head_dim = d;
    c.page_size = 16;
    c.cache_rows = 320;
    c.cache_seqlens = {301, 150};
    c.leftpad = {0, 7};
    t.push_back(c);
    c.name = "alibi_prefill_hd" + std::to_string(d) + "_causal";
    c.page_size = 0;
    c.cache_rows = 160;
    c.cache_seqlens = {30, 140};
    c.seqlen_q = c.seqlen_new = 17;
    c.leftpad = {};
    c.causal = true;
    t.push_back(c);
  }
  return t;
}

std::string KvCheck::describe() const {
  std::ostringstream s;
  s << "out error " << out_error << " (baseline " << out_baseline << "), lse error " << lse_error << ", all written "
    << all_written << ", cache ok " << cache_ok << ", masked rows ok " << masked_rows_ok;
  return s.str();
}

namespace {

using host::DeviceBuffer;
using host::HostTensor;

float round_to(DType dtype, float x) {
  HostTensor t(dtype, {1});
  t.set(0, x);
  return t.get(0);
}

// Rotates x[0, rotary_dim) at `pos` by the tables (values as float), in the test's own words.
void rotate(std::vector<float>& x, const HostTensor& cos, const HostTensor& sin, int pos, int rotary_dim,
            bool interleaved) {
  const int half = rotary_dim / 2;
  for (int j = 0; j < half; ++j) {
    const int a = interleaved ? 2 * j : j, b = interleaved ? 2 * j + 1 : j + half;
    const float c = cos.get(std::int64_t(pos) * half + j), s = sin.get(std::int64_t(pos) * half + j);
    const float x0 = x[a], x1 = x[b];
    x[a] = x0 * c - x1 * s;
    x[b] = x0 * s + x1 * c;
  }
}

// Element index (row-major) of (i0, i1, i2, i3) in a contiguous 4D tensor.
std::int64_t at4(const HostTensor& t, std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d) {
  const auto& s = t.shape();
  return ((a * s[1] + b) * s[2] + c) * s[3] + d;
}

struct Views {
  std::vector<HostTensor*> host;
  std::vector<DeviceBuffer> dev;
  DeviceKind kind;
  Views(DeviceKind k, std::vector<HostTensor*> h) : host(std::move(h)), kind(k) {
    if (kind == DeviceKind::cuda)
      for (HostTensor* t : host) dev.push_back(DeviceBuffer::upload(*t));
  }
  TensorView view(std::size_t i) { return kind == DeviceKind::cuda ? host[i]->view(kind, dev[i].data()) : host[i]->view(); }
  void download(std::initializer_list<std::size_t> which) {
    if (kind != DeviceKind::cuda) return;
    host::device_synchronize();
    for (std::size_t i : which) dev[i].download(*host[i]);
  }
};

// out/LSE of the float64 reference (or the same-precision baseline) on packed sequences.
// slopes: ALiBi's (null: none), (heads_q,) or (batch, heads_q).
void reference_varlen(DType dtype, const HostTensor& q, const HostTensor& k, const HostTensor& v,
                      HostTensor& cu_q, HostTensor& cu_k, int max_q, int max_k, bool causal, int wl, int wr,
                      float softcap, HostTensor* slopes, HostTensor& out, HostTensor& lse, std::optional<DType> round) {
  HostTensor q32 = q.to_f32(), k32 = k.to_f32(), v32 = v.to_f32();
  ForwardArgs a;
  if (slopes != nullptr) a.alibi_slopes = slopes->view();
  a.causal = causal;
  a.window_left = wl;
  a.window_right = wr;
  a.softcap = softcap;
  a.softmax_scale = 1.0f / std::sqrt(float(q.shape()[2]));
  a.cu_seqlens_q = cu_q.view();
  a.cu_seqlens_k = cu_k.view();
  a.max_seqlen_q = max_q;
  a.max_seqlen_k = max_k;
  a.q = q32.view();
  a.k = k32.view();
  a.v = v32.view();
  out = HostTensor(DType::f32, q32.shape());
  lse = HostTensor(DType::f32, {q.shape()[1], q.shape()[0]});
  a.out = out.view();
  a.lse = lse.view();
  cpu::reference_forward(detail::make_forward_problem(a), round);
  (void)dtype;
}

HostTensor offsets(const std::vector<int>& lens) {
  HostTensor t(DType::i32, {std::int64_t(lens.size()) + 1});
  auto* p = static_cast<std::int32_t*>(t.data());
  p[0] = 0;
  for (std::size_t i = 0; i < lens.size(); ++i) p[i + 1] = p[i] + lens[i];
  return t;
}

HostTensor ints(const std::vector<int>& values) {
  HostTensor t(DType::i32, {std::int64_t(values.size())});
  std::copy(values.begin(), values.end(), static_cast<std::int32_t*>(t.data()));
  return t;
}

bool any_nan(const std::vector<float>& x) {
  return std::any_of(x.begin(), x.end(), [](float f) { return std::isnan(f); });
}

// ALiBi slopes of shape (heads_q,) or (batch, heads_q) in [0.05, 0.55), as the shared table draws
// them; a placeholder without ALiBi.
HostTensor kv_slopes(Alibi alibi, int batch, int heads_q, std::mt19937_64& rng) {
  if (alibi == Alibi::none) return HostTensor(DType::f32, {1});
  HostTensor t = alibi == Alibi::heads ? HostTensor(DType::f32, {heads_q}) : HostTensor(DType::f32, {batch, heads_q});
  std::uniform_real_distribution<float> slope(0.05f, 0.55f);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, slope(rng));
  return t;
}

}  // namespace

KvCheck check_kvcache(const KvCase& c, DType dtype, DeviceKind device, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int B = c.batch, Hq = c.heads_q, Hk = c.heads_kv, D = c.head_dim, Sq = c.seqlen_q, N = c.seqlen_new;
  const bool paged = c.page_size > 0;
  const int max_blocks = paged ? c.cache_rows / c.page_size : 0;
  const int num_blocks = paged ? 2 * B * max_blocks + 1 : 0;
  const int batch_cache = c.batch_idx ? 2 * B : B;

  // Logical caches (batch, cache_rows, Hk, D), then the storage the call sees.
  HostTensor kl(dtype, {B, c.cache_rows, Hk, D}), vl(dtype, {B, c.cache_rows, Hk, D});
  kl.fill_normal(rng);
  vl.fill_normal(rng);
  std::vector<int> table(std::size_t(B) * std::max(max_blocks, 1)), cache_batch(B);
  HostTensor kc, vc;
  if (paged) {
    std::vector<int> pages(num_blocks);
    std::iota(pages.begin(), pages.end(), 0);
    std::shuffle(pages.begin(), pages.end(), rng);
    std::copy(pages.begin(), pages.begin() + B * max_blocks, table.begin());
    kc = HostTensor(dtype, {num_blocks, c.page_size, Hk, D});
    vc = HostTensor(dtype, {num_blocks, c.page_size, Hk, D});
  } else {
    std::vector<int> perm(batch_cache);
    std::iota(perm.begin(), perm.end(), 0);
    if (c.batch_idx) std::shuffle(perm.begin(), perm.end(), rng);
    std::copy(perm.begin(), perm.begin() + B, cache_batch.begin());
    kc = HostTensor(dtype, {batch_cache, c.cache_rows, Hk, D});
    vc = HostTensor(dtype, {batch_cache, c.cache_rows, Hk, D});
  }
  kc.fill_normal(rng);  // rows no sequence owns: must stay as they are
  vc.fill_normal(rng);
  // Storage index of logical (b, row, h, 0).
  auto storage = [&](const HostTensor& t, int b, int row, int h) {
    if (paged) return at4(t, table[std::size_t(b) * max_blocks + row / c.page_size], row % c.page_size, h, 0);
    return at4(t, cache_batch[b], row, h, 0);
  };
  for (int b = 0; b < B; ++b)
    for (int r = 0; r < c.cache_rows; ++r)
      for (int h = 0; h < Hk; ++h)
        for (int d = 0; d < D; ++d) {
          kc.set(storage(kc, b, r, h) + d, kl.get(at4(kl, b, r, h, d)));
          vc.set(storage(vc, b, r, h) + d, vl.get(at4(vl, b, r, h, d)));
        }
  HostTensor q(dtype, {B, Sq, Hq, D}), kn(dtype, {B, std::max(N, 1), Hk, D}), vn(dtype, {B, std::max(N, 1), Hk, D});
  for (HostTensor* t : {&q, &kn, &vn}) t->fill_normal(rng);
  const int half = std::max(c.rotary_dim / 2, 1);
  HostTensor cos(dtype, {c.cache_rows, half}), sin(dtype, {c.cache_rows, half});
  {
    std::uniform_real_distribution<float> angle(0.0f, 6.2831853f);
    for (std::int64_t i = 0; i < cos.numel(); ++i) {
      const float a = angle(rng);
      cos.set(i, std::cos(a));
      sin.set(i, std::sin(a));
    }
  }
  HostTensor slopes = kv_slopes(c.alibi, B, Hq, rng);
  HostTensor kc_before = kc, vc_before = vc;
  HostTensor out(dtype, {B, Sq, Hq, D}), lse(DType::f32, {B, Hq, Sq});
  out.poison();
  lse.poison();
  HostTensor seqlens = ints(c.cache_seqlens), tab = ints(table), bidx = ints(cache_batch),
             pad = ints(c.leftpad.empty() ? std::vector<int>(B, 0) : c.leftpad);
  if (paged) tab = HostTensor(DType::i32, {B, max_blocks}), std::copy(table.begin(), table.end(), static_cast<std::int32_t*>(tab.data()));

  Views ops(device, {&q, &kc, &vc, &kn, &vn, &cos, &sin, &out, &lse, &seqlens, &tab, &bidx, &pad, &slopes});
  KvCacheArgs a;
  a.q = ops.view(0);
  a.k_cache = ops.view(1);
  a.v_cache = ops.view(2);
  if (N > 0) a.k_new = ops.view(3), a.v_new = ops.view(4);
  if (c.rotary_dim > 0) a.rotary_cos = ops.view(5), a.rotary_sin = ops.view(6), a.rotary_interleaved = c.interleaved;
  a.out = ops.view(7);
  a.lse = ops.view(8);
  a.cache_seqlens = ops.view(9);
  if (paged) a.block_table = ops.view(10);
  if (c.batch_idx) a.cache_batch_idx = ops.view(11);
  if (!c.leftpad.empty()) a.cache_leftpad = ops.view(12);
  a.causal = c.causal;
  a.window_left = c.window_left;
  a.window_right = c.window_right;
  a.softcap = c.softcap;
  if (c.alibi != Alibi::none) a.alibi_slopes = ops.view(13);
  a.num_splits = c.num_splits;
  forward_kvcache(a);
  ops.download({1, 2, 7, 8});

  // Expected: the logical cache with the new rows (keys rotated) appended; q rotated.
  const bool by_row = c.causal || c.window_left >= 0 || c.window_right >= 0;
  std::vector<float> row(D);
  for (int b = 0; b < B; ++b)
    for (int i = 0; i < N; ++i)
      for (int h = 0; h < Hk; ++h) {
        const int pos = c.cache_seqlens[b] + i;
        for (int d = 0; d < D; ++d) row[d] = kn.get(at4(kn, b, i, h, d));
        if (c.rotary_dim > 0) rotate(row, cos, sin, pos, c.rotary_dim, c.interleaved);
        for (int d = 0; d < D; ++d) {
          kl.set(at4(kl, b, pos, h, d), row[d]);
          vl.set(at4(vl, b, pos, h, d), vn.get(at4(vn, b, i, h, d)));
        }
      }
  HostTensor qr = q;
  if (c.rotary_dim > 0)
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < Sq; ++i)
        for (int h = 0; h < Hq; ++h) {
          for (int d = 0; d < D; ++d) row[d] = q.get(at4(q, b, i, h, d));
          rotate(row, cos, sin, c.cache_seqlens[b] + (by_row ? i : 0), c.rotary_dim, c.interleaved);
          for (int d = 0; d < D; ++d) qr.set(at4(qr, b, i, h, d), row[d]);
        }

  KvCheck r;
  // The cache: every storage element as expected (appended rows within a rounding of the
  // rotation, everything else bit for bit).
  {
    HostTensor k_exp = kc_before, v_exp = vc_before;
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < N; ++i)
        for (int h = 0; h < Hk; ++h)
          for (int d = 0; d < D; ++d) {
            const int pos = c.cache_seqlens[b] + i;
            k_exp.set(storage(k_exp, b, pos, h) + d, kl.get(at4(kl, b, pos, h, d)));
            v_exp.set(storage(v_exp, b, pos, h) + d, vl.get(at4(vl, b, pos, h, d)));
          }
    const auto kg = kc.to_floats(), ke = k_exp.to_floats(), vg = vc.to_floats(), ve = v_exp.to_floats();
    const double ulp = dtype == DType::bf16 ? 1.0 / 128 : dtype == DType::f16 ? 1.0 / 1024 : 1e-6;
    for (std::size_t i = 0; i < kg.size(); ++i)
      if (std::abs(kg[i] - ke[i]) > ulp * std::abs(ke[i]) + 1e-6 || vg[i] != ve[i]) r.cache_ok = false;
  }

  // Reference: each sequence's keys [leftpad, seqlen + new) packed, the rotated queries packed.
  std::vector<int> lens_q(B, Sq), lens_k(B);
  int total_k = 0, max_k = 0;
  for (int b = 0; b < B; ++b) {
    lens_k[b] = c.cache_seqlens[b] + N - (c.leftpad.empty() ? 0 : c.leftpad[b]);
    total_k += lens_k[b];
    max_k = std::max(max_k, lens_k[b]);
  }
  HostTensor kp(dtype, {std::max(total_k, 1), Hk, D}), vp(dtype, {std::max(total_k, 1), Hk, D});
  HostTensor qp(dtype, {std::int64_t(B) * Sq, Hq, D});
  for (std::int64_t i = 0; i < qp.numel(); ++i) qp.set(i, qr.get(i));
  {
    std::int64_t row0 = 0;
    for (int b = 0; b < B; ++b) {
      const int start = c.leftpad.empty() ? 0 : c.leftpad[b];
      for (int j = 0; j < lens_k[b]; ++j, ++row0)
        for (int h = 0; h < Hk; ++h)
          for (int d = 0; d < D; ++d) {
            kp.set((row0 * Hk + h) * D + d, kl.get(at4(kl, b, start + j, h, d)));
            vp.set((row0 * Hk + h) * D + d, vl.get(at4(vl, b, start + j, h, d)));
          }
    }
  }
  HostTensor cu_q = offsets(lens_q), cu_k = offsets(lens_k);
  HostTensor ref_out, ref_lse, base_out, base_lse;
  // ALiBi: the packed sequence b is keys [leftpad, cache_seqlens + seqlen_new) of the cache, so
  // the reference's bias -slope * |i + len_k - Sq - j| counts from the last key, as flash-attn's.
  HostTensor* ref_slopes = c.alibi != Alibi::none ? &slopes : nullptr;
  reference_varlen(dtype, qp, kp, vp, cu_q, cu_k, Sq, max_k, c.causal, c.window_left, c.window_right, c.softcap,
                   ref_slopes, ref_out, ref_lse, std::nullopt);
  reference_varlen(dtype, qp, kp, vp, cu_q, cu_k, Sq, max_k, c.causal, c.window_left, c.window_right, c.softcap,
                   ref_slopes, base_out, base_lse, dtype);
  const auto got = out.to_floats(), ref = ref_out.to_floats();
  r.out_error = host::relative_error(got, ref);
  r.out_baseline = host::relative_error(base_out.to_floats(), ref);
  r.all_written = !any_nan(got);
  // LSE: ours (batch, heads, seq) against the reference's (heads, total_q).
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < Hq; ++h)
      for (int i = 0; i < Sq; ++i) {
        const float g = lse.get((std::int64_t(b) * Hq + h) * Sq + i), e = ref_lse.get(std::int64_t(h) * B * Sq + b * Sq + i);
        if (std::isnan(g)) r.all_written = false;
        if (std::isinf(e)) {  // a row that sees no key: LSE -inf, out exactly 0
          if (!(std::isinf(g) && g < 0)) r.masked_rows_ok = false;
          for (int d = 0; d < D; ++d)
            if (out.get(at4(out, b, i, h, d)) != 0.0f) r.masked_rows_ok = false;
          continue;
        }
        r.lse_error = std::max(r.lse_error, std::abs(double(g) - e) / std::max(1.0, std::abs(double(e))));
      }
  (void)round_to;
  return r;
}

const char* to_string(PoolLayout layout) {
  switch (layout) {
    case PoolLayout::contiguous: return "contiguous pool";
    case PoolLayout::heads_major: return "heads-major pool";
    case PoolLayout::padded_heads: return "padded heads";
  }
  return "?";
}

KvCheck check_paged_varlen(int page_size, bool causal, DType dtype, DeviceKind device, std::uint64_t seed,
                           Alibi alibi, int head_dim, bool one_sm_long_queries, PoolLayout layout) {
  std::mt19937_64 rng(seed);
  const std::vector<int> lens_q = one_sm_long_queries ? std::vector<int>{150, 1, 300} : std::vector<int>{5, 1, 40};
  const std::vector<int> lens_k = one_sm_long_queries ? std::vector<int>{420, 1, 600} : std::vector<int>{70, 1, 300};
  // With ALiBi, seqused_k: sequences 0 and 2 use fewer keys than cu_seqlens_k gives them (the
  // bias counts from the last key in use), sequence 0 fewer than its queries (causal: masked rows).
  const std::vector<int> used = alibi != Alibi::none ? std::vector<int>{3, 1, lens_k[2] - 43} : lens_k;
  const int B = 3, Hq = 4, Hk = 2, D = head_dim;
  int max_k = 0, max_q = 0, total_q = 0, total_k = 0;
  for (int b = 0; b < B; ++b) {
    max_k = std::max(max_k, lens_k[b]), max_q = std::max(max_q, lens_q[b]);
    total_q += lens_q[b], total_k += lens_k[b];
  }
  const int max_blocks = (max_k + page_size - 1) / page_size, num_blocks = B * max_blocks + 2;
  std::vector<int> pages(num_blocks);
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), rng);
  HostTensor tab(DType::i32, {B, max_blocks});
  std::copy(pages.begin(), pages.begin() + B * max_blocks, static_cast<std::int32_t*>(tab.data()));
  // The pools in memory (`layout`), and where element (page, row, head, d) of their views lies.
  const int pad = layout == PoolLayout::padded_heads ? 8 : 0, Dp = D + pad;
  const std::vector<std::int64_t> pool_shape =
      layout == PoolLayout::heads_major ? std::vector<std::int64_t>{num_blocks, Hk, page_size, D}
                                        : std::vector<std::int64_t>{num_blocks, page_size, Hk, Dp};
  const std::array<std::int64_t, 4> pool_stride =
      layout == PoolLayout::heads_major
          ? std::array<std::int64_t, 4>{std::int64_t(Hk) * page_size * D, D, std::int64_t(page_size) * D, 1}
          : std::array<std::int64_t, 4>{std::int64_t(page_size) * Hk * Dp, std::int64_t(Hk) * Dp, Dp, 1};
  auto pool_at = [&](std::int64_t page, std::int64_t row, std::int64_t h, std::int64_t d) {
    return page * pool_stride[0] + row * pool_stride[1] + h * pool_stride[2] + d;
  };
  HostTensor kc(dtype, pool_shape), vc(dtype, pool_shape);
  HostTensor q(dtype, {total_q, Hq, D}), out(dtype, {total_q, Hq, D}), lse(DType::f32, {Hq, total_q});
  for (HostTensor* t : {&kc, &vc, &q}) t->fill_normal(rng);
  out.poison();
  lse.poison();
  const auto* table = static_cast<const std::int32_t*>(tab.data());
  // Every pool row that holds no key in use is NaN, as an engine's uninitialized pool may be:
  // the call must neither read them into a result nor multiply them by zero probabilities. So
  // are the columns padding a head: nothing may read past the head dim.
  {
    std::vector<char> live(std::size_t(num_blocks) * page_size, 0);
    for (int b = 0; b < B; ++b)
      for (int j = 0; j < used[b]; ++j)
        live[std::size_t(table[b * max_blocks + j / page_size]) * page_size + j % page_size] = 1;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (int page = 0; page < num_blocks; ++page)
      for (int row = 0; row < page_size; ++row)
        for (int h = 0; h < Hk; ++h)
          for (int d = live[std::size_t(page) * page_size + row] ? D : 0; d < Dp; ++d) {
            kc.set(pool_at(page, row, h, d), nan);
            vc.set(pool_at(page, row, h, d), nan);
          }
  }
  // The gathered contiguous K/V.
  HostTensor kp(dtype, {total_k, Hk, D}), vp(dtype, {total_k, Hk, D});
  for (int b = 0, row0 = 0; b < B; row0 += lens_k[b], ++b)
    for (int j = 0; j < lens_k[b]; ++j)
      for (int h = 0; h < Hk; ++h)
        for (int d = 0; d < D; ++d) {
          const std::int64_t src = pool_at(table[b * max_blocks + j / page_size], j % page_size, h, d);
          kp.set((std::int64_t(row0 + j) * Hk + h) * D + d, kc.get(src));
          vp.set((std::int64_t(row0 + j) * Hk + h) * D + d, vc.get(src));
        }
  HostTensor cu_q = offsets(lens_q), cu_k = offsets(lens_k), seqused = ints(used);
  HostTensor slopes = kv_slopes(alibi, B, Hq, rng);
  Views ops(device, {&q, &kc, &vc, &out, &lse, &cu_q, &cu_k, &tab, &seqused, &slopes});
  ForwardArgs a;
  a.q = ops.view(0);
  auto pool_view = [&](TensorView t) {
    t.shape = {num_blocks, page_size, Hk, D};
    t.stride = pool_stride;
    return t;
  };
  a.k = pool_view(ops.view(1));
  a.v = pool_view(ops.view(2));
  a.out = ops.view(3);
  a.lse = ops.view(4);
  a.cu_seqlens_q = ops.view(5);
  a.cu_seqlens_k = ops.view(6);
  a.block_table = ops.view(7);
  a.max_seqlen_q = max_q;
  a.max_seqlen_k = max_k;
  a.causal = causal;
  // One SM: the sm90 tile rule counts waves as tiles, and at head dim 64 takes 192-row tiles for
  // these 150- and 300-query sequences (test_tile_choice.cpp checks it), so the paged kernel of
  // three consumer warpgroups runs too.
  if (one_sm_long_queries) a.sm_margin = 1 << 20;
  if (alibi != Alibi::none) a.seqused_k = ops.view(8), a.alibi_slopes = ops.view(9);
  forward(a);
  ops.download({3, 4});
  // The reference's keys: the first used[b] of each sequence's gathered rows.
  std::vector<int> ref_lens_k = used;
  int total_used = 0;
  for (int u : used) total_used += u;
  HostTensor ku(dtype, {std::max(total_used, 1), Hk, D}), vu(dtype, {std::max(total_used, 1), Hk, D});
  for (int b = 0, row0 = 0, used0 = 0; b < B; row0 += lens_k[b], used0 += used[b], ++b)
    for (std::int64_t e = 0; e < std::int64_t(used[b]) * Hk * D; ++e) {
      ku.set(std::int64_t(used0) * Hk * D + e, kp.get(std::int64_t(row0) * Hk * D + e));
      vu.set(std::int64_t(used0) * Hk * D + e, vp.get(std::int64_t(row0) * Hk * D + e));
    }
  HostTensor cu_used = offsets(ref_lens_k);
  HostTensor* ref_slopes = alibi != Alibi::none ? &slopes : nullptr;
  HostTensor ref_out, ref_lse, base_out, base_lse;
  reference_varlen(dtype, q, ku, vu, cu_q, cu_used, max_q, max_k, causal, -1, -1, 0, ref_slopes, ref_out, ref_lse,
                   std::nullopt);
  reference_varlen(dtype, q, ku, vu, cu_q, cu_used, max_q, max_k, causal, -1, -1, 0, ref_slopes, base_out, base_lse,
                   dtype);
  KvCheck r;
  const auto got = out.to_floats(), ref = ref_out.to_floats();
  r.out_error = host::relative_error(got, ref);
  r.out_baseline = host::relative_error(base_out.to_floats(), ref);
  r.all_written = !any_nan(got) && !any_nan(lse.to_floats());
  const auto gl = lse.to_floats(), rl = ref_lse.to_floats();
  for (std::size_t i = 0; i < gl.size(); ++i) {
    if (std::isinf(rl[i])) {  // a row that sees no key (LSE (heads, total_q)): LSE -inf, out exactly 0
      const std::size_t row = i % std::size_t(total_q), head = i / std::size_t(total_q);
      if (!(std::isinf(gl[i]) && gl[i] < 0)) r.masked_rows_ok = false;
      for (int d = 0; d < D; ++d)
        if (got[(row * Hq + head) * D + d] != 0.0f) r.masked_rows_ok = false;
      continue;
    }
    r.lse_error = std::max(r.lse_error, std::abs(double(gl[i]) - rl[i]) / std::max(1.0, std::abs(double(rl[i]))));
  }
  return r;
}

}  // namespace flashattn::testing
