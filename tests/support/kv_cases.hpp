#pragma once
// The KV-cache case table (flashattn/kv_cache.hpp), run on every backend: contiguous and paged
// caches, append + rotary, cache_batch_idx, cache_leftpad, masks, ALiBi; checked against the float64
// reference on an independently built contiguous copy of the cache.
#include <cstdint>
#include <string>
#include <vector>

#include "cases.hpp"
#include "flashattn/tensor.hpp"

namespace flashattn::testing {

struct KvCase {
  std::string name;
  int batch = 2, heads_q = 4, heads_kv = 2, head_dim = 64, seqlen_q = 1;
  int cache_rows = 300;            // seqlen_cache, or max_blocks * page_size when paged
  std::vector<int> cache_seqlens;  // rows before the call, per sequence
  int seqlen_new = 0;              // rows appended (k/v)
  int page_size = 0;               // 0: contiguous cache
  bool batch_idx = false;          // contiguous: a cache of 2 * batch, sequences at permuted rows
  std::vector<int> leftpad;        // empty: none
  int rotary_dim = 0;
  bool interleaved = false;
  bool causal = false;
  int window_left = -1, window_right = -1;
  float softcap = 0.0f;
  // ALiBi slopes (drawn in [0.05, 0.55) with the inputs): the reference sees each sequence's keys
  // [leftpad, cache_seqlens + seqlen_new) as a sequence of its own, which is flash-attn's bias.
  Alibi alibi = Alibi::none;
  int num_splits = 0;  // KvCacheArgs::num_splits (GPU split-KV count; 0 = the heuristic)
};

std::vector<KvCase> kv_cases();

struct KvCheck {
  double out_error = 0, out_baseline = 0, lse_error = 0;
  bool all_written = true;
  bool cache_ok = true;  // appended rows as expected, every other cache element untouched
  bool masked_rows_ok = true;  // rows that see no key: out exactly 0, LSE -inf
  std::string describe() const;
};

KvCheck check_kvcache(const KvCase& c, DType dtype, DeviceKind device, std::uint64_t seed);

// How a paged pool's (num_blocks, page_size, heads_kv, d) view lies in memory: contiguous
// (flash-attn's), each page's heads one after another ((num_blocks, heads_kv, page_size, d) seen
// through strides), or with 8 NaN columns after each head's d.
enum class PoolLayout { contiguous, heads_major, padded_heads };
const char* to_string(PoolLayout layout);

// Paged K/V in the variable-length forward (ForwardArgs::block_table), against the reference
// on the gathered contiguous K/V; with `alibi`, slopes of that shape (and seqused_k shortening
// two of the sequences, so that the bias counts from the keys in use). Pool rows holding no key
// in use are NaN; sequences end inside a page and inside a 16-row box of it.
KvCheck check_paged_varlen(int page_size, bool causal, DType dtype, DeviceKind device, std::uint64_t seed,
                           Alibi alibi = Alibi::none, int head_dim = 64, bool one_sm_long_queries = false,
                           PoolLayout layout = PoolLayout::contiguous);

}  // namespace flashattn::testing
