#pragma once
// The append + rotary part of a KV-cache call (flashattn/kv_cache.hpp), validated: which rows to
// write into the cache and how to rotate them and the queries. Backends run it before the
// attention; the cache rows themselves are addressed through kv_layout.hpp.
#include <cstdint>

#include "common/host_device.hpp"
#include "common/seq_tensor.hpp"

namespace flashattn::detail {

struct KvAppend {
  // New keys and values, (batch, seqlen_new, heads_kv, head_dim); data null: nothing appended.
  SeqTensor k_new, v_new;
  int seqlen_new = 0;
  // Rows in each cache before the call (the storage row where the first new row goes).
  const std::int32_t* cache_seqlens = nullptr;

  // Rotary embedding; cos null: none. cos/sin are (seqlen_ro, rotary_dim / 2) in the problem's
  // dtype, rows `cos_stride` / `sin_stride` elements apart.
  const void* cos = nullptr;
  const void* sin = nullptr;
  std::int64_t cos_stride = 0, sin_stride = 0;
  int rotary_dim = 0;
  bool interleaved = false;
  // Causal or local: query row i sits at position cache_seqlens[b] + i; otherwise every query
  // row of sequence b at cache_seqlens[b] (flash-attn's meaning).
  bool query_positions_by_row = false;

  FA_HOST_DEVICE bool appends() const { return k_new.data != nullptr; }
  FA_HOST_DEVICE bool rotates() const { return cos != nullptr; }
  // Position of query row i of sequence b.
  FA_HOST_DEVICE int query_position(int b, int i) const {
    return cache_seqlens[b] + (query_positions_by_row ? i : 0);
  }
};

// Rotates one head's vector x[0, rotary_dim) in place by the angle table row (cos, sin), as
// flash-attn: pairs (2j, 2j + 1) interleaved, (j, j + rotary_dim / 2) otherwise. fp32 math.
template <class LoadAngle>
FA_HOST_DEVICE void rotate_pairs(float* x, int rotary_dim, bool interleaved, LoadAngle cos_sin) {
  const int half = rotary_dim / 2;
  for (int j = 0; j < half; ++j) {
    const int i0 = interleaved ? 2 * j : j, i1 = interleaved ? 2 * j + 1 : j + half;
    float c, s;
    cos_sin(j, c, s);
    const float x0 = x[i0], x1 = x[i1];
    x[i0] = x0 * c - x1 * s;
    x[i1] = x0 * s + x1 * c;
  }
}

}  // namespace flashattn::detail
