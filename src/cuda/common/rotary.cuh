#pragma once
// One head's row of a KV-cache call's append + rotary on the GPU, a pair of columns at a time:
// the append kernel (cuda/kv_append.cu) and the sm80 decode kernel that appends itself
// (sm80/fused_append.cuh) share it, so both give the same bits.
//
// Pair j < rotary_dim / 2 is flash-attn's rotary pair: (2j, 2j + 1) interleaved, else
// (j, j + rotary_dim / 2); every pair after those is (2j, 2j + 1), unrotated. Pairs
// [0, (width + 1) / 2) cover columns [0, width) once. fp32 math, as the CPU's rotate_pairs
// (common/kv_append.hpp).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/kv_append.hpp"
#include "common/kv_layout.hpp"

namespace flashattn::cuda {

template <class T>
__device__ float to_float(T x);
template <>
__device__ inline float to_float(__half x) { return __half2float(x); }
template <>
__device__ inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T>
__device__ T from_float(float x);
template <>
__device__ inline __half from_float(float x) { return __float2half_rn(x); }
template <>
__device__ inline __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }

// New row i of sequence b, head h, in a call's k_new or v_new.
template <class T>
__device__ const T* new_row(const detail::SeqTensor& t, int b, int i, int h) {
  return static_cast<const T*>(t.data) + b * t.batch_stride + std::int64_t(i) * t.seq_stride +
         std::int64_t(h) * t.head_stride;
}

// Storage row `row` of sequence b (cache batch kv_batch), KV head h, in a cache whose strides are
// `layout`'s (contiguous, or pages through `pages`: common/kv_layout.hpp).
template <class T>
__device__ T* cache_row(const void* cache, const detail::SeqTensor& layout, const detail::KvPages& pages, int b,
                        int kv_batch, int row, int h) {
  return static_cast<T*>(const_cast<void*>(cache)) +
         detail::kv_element(pages, layout.batch_stride, layout.seq_stride, layout.head_stride, b, kv_batch, row, h);
}

// Stores pair j of the row `src` (head_dim columns) through store(column, value), for columns
// below `width` (columns from head_dim on store 0), rotated at `position` when `rotate`.
template <class T, class Store>
__device__ void copy_row_pair(const detail::KvAppend& a, const T* src, int head_dim, int width, int position,
                              bool rotate, int j, Store&& store) {
  const int half = rotate ? a.rotary_dim / 2 : 0;
  if (j < half) {
    const int c0 = a.interleaved ? 2 * j : j, c1 = a.interleaved ? 2 * j + 1 : j + half;
    const T* cos = static_cast<const T*>(a.cos) + std::int64_t(position) * a.cos_stride;
    const T* sin = static_cast<const T*>(a.sin) + std::int64_t(position) * a.sin_stride;
    const float x0 = to_float(src[c0]), x1 = to_float(src[c1]);
    const float c = to_float(cos[j]), s = to_float(sin[j]);
    store(c0, from_float<T>(x0 * c - x1 * s));
    store(c1, from_float<T>(x0 * s + x1 * c));
    return;
  }
  for (int c = 2 * j; c < 2 * j + 2 && c < width; ++c) store(c, c < head_dim ? src[c] : from_float<T>(0.f));
}

}  // namespace flashattn::cuda
