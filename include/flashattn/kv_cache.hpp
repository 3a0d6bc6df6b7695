#pragma once
// Attention over a KV cache, for serving (flash-attn 2's flash_attn_with_kvcache): optionally
// appends new keys and values to the cache in place, rotating the new keys and the queries
// (rotary embedding), then attends the queries to the cache, in one call.
//
// q: (batch, seqlen_q, heads_q, head_dim): 1 query per sequence (decoding), a few (speculative
// decoding) or many (chunked prefill).
// k_cache, v_cache: contiguous (batch_cache, seqlen_cache, heads_kv, head_dim), or paged
// (num_blocks, page_size, heads_kv, head_dim) with block_table (batch, max_blocks) int32:
// rows [i * page_size, (i + 1) * page_size) of sequence b live in page block_table[b][i].
// page_size: a multiple of 16 from 16 to 512.
//
// Sequence b's cache holds cache_seqlens[b] rows before the call (absent: the whole cache,
// seqlen_cache or max_blocks * page_size rows). With k_new/v_new (batch, seqlen_new, heads_kv,
// head_dim), those rows are written at rows cache_seqlens[b] .. cache_seqlens[b] + seqlen_new - 1
// (the caller advances cache_seqlens afterwards). The queries then attend to rows
// [cache_leftpad[b], cache_seqlens[b] + seqlen_new) of the cache, with causal and window masks
// aligned to the bottom-right corner of that range (as flash-attn).
//
// Rotary (rotary_cos/rotary_sin present, (seqlen_ro, rotary_dim / 2), q's dtype, rotary_dim
// even and <= head_dim, seqlen_ro >= the cache's rows; requires k_new): new key row i is
// rotated at position cache_seqlens[b] + i before it is written; query row i at position
// cache_seqlens[b] + i when causal or local, at cache_seqlens[b] otherwise (flash-attn's
// meaning). Interleaved: dims (2j, 2j+1) are rotated together; otherwise (j, j + rotary_dim/2).
// Dims from rotary_dim on are unchanged. q itself is not modified.
//
// cache_batch_idx (batch,) int32: sequence b uses cache batch cache_batch_idx[b] (contiguous
// caches only; distinct entries when appending). cache_leftpad (batch,) int32: the first cache
// row of sequence b (left padding), <= cache_seqlens[b].
//
// ALiBi (alibi_slopes, optional: float32 (heads_q,) or (batch, heads_q), indexed by sequence b,
// not by its cache batch): the score of query row i and cache row j gains
//   -slope[b, h] * |i + (cache_seqlens[b] + seqlen_new) - seqlen_q - j|,
// j counted from the cache's row 0 (cache_leftpad moves which rows are seen, not the distance):
// flash-attn's bias with seqlen_k the rows the sequence sees, [cache_leftpad[b], cache_seqlens[b]
// + seqlen_new), and keys counted from cache_leftpad[b].
//
// Every argument is validated first; on CPU tensors the contents of cache_seqlens, block_table,
// cache_batch_idx and cache_leftpad are checked too (entries in range, the append fits, rotary
// tables long enough). On error a flashattn::Error is thrown and nothing is written, the cache
// included. Device-resident contents are trusted as cu_seqlens are.
#include <optional>

#include "flashattn/attention.hpp"

namespace flashattn {

struct KvCacheArgs {
  TensorView q;
  TensorView k_cache, v_cache;  // modified in place when k_new/v_new are given
  TensorView block_table;       // paged caches only
  TensorView cache_seqlens;     // (batch,) int32; absent: every cache full
  TensorView cache_batch_idx;   // (batch,) int32; optional
  TensorView cache_leftpad;     // (batch,) int32; optional
  TensorView k_new, v_new;      // (batch, seqlen_new, heads_kv, head_dim); both or neither
  TensorView rotary_cos, rotary_sin;  // both or neither
  bool rotary_interleaved = false;
  TensorView out;  // like q
  TensorView lse;  // optional, float32 (batch, heads_q, seqlen_q)

  std::optional<float> softmax_scale;  // default 1/sqrt(head_dim)
  bool causal = false;
  int window_left = -1;
  int window_right = -1;
  float softcap = 0.0f;
  TensorView alibi_slopes;  // optional: ALiBi, as AttentionOptions::alibi_slopes (above)
  int num_splits = 0;  // split-KV count on the GPU; 0 = the library's heuristic
  void* stream = nullptr;
};

void forward_kvcache(const KvCacheArgs& args);

namespace reference {
// forward_kvcache() with the attention computed by the float64 reference (CPU tensors).
void forward_kvcache(const KvCacheArgs& args);
}  // namespace reference

}  // namespace flashattn
