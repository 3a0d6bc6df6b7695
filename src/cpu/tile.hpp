#pragma once
// Moving rows of a (batch, seq, heads, dim) operand between the caller's dtype and the fp32
// tiles the CPU kernels compute on, and which keys a block of query rows may see.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <vector>

#include "common/mask.hpp"
#include "common/numeric.hpp"
#include "cpu/access.hpp"
#include "cpu/simd.hpp"

namespace flashattn::cpu {

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline int round_up(int x, int multiple) { return (x + multiple - 1) / multiple * multiple; }

// Cache-line aligned storage for tiles, so that full vectors never straddle two lines.
template <class T>
struct CacheAlignedAllocator {
  using value_type = T;
  CacheAlignedAllocator() = default;
  template <class U>
  CacheAlignedAllocator(const CacheAlignedAllocator<U>&) {}
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(64))); }
  void deallocate(T* p, std::size_t) { ::operator delete(p, std::align_val_t(64)); }
  template <class U>
  bool operator==(const CacheAlignedAllocator<U>&) const { return true; }
};
using FloatBuffer = std::vector<float, CacheAlignedAllocator<float>>;

// The rows of one head of one sequence: row r starts at element at(r), which is
// first + r * row_stride, or for paged K/V (pages != null) the row's place in its page.
struct RowsView {
  DType dtype;
  void* data;
  std::int64_t first;
  std::int64_t row_stride;
  const std::int32_t* pages = nullptr;  // the sequence's row of block_table
  int page_size = 0;
  std::int64_t page_stride = 0;
  std::int64_t row0 = 0;  // paged: the storage row of row 0

  std::int64_t at(std::int64_t row) const {
    if (pages == nullptr) return first + row * row_stride;
    const std::int64_t r = row0 + row;
    return first + std::int64_t(pages[r / page_size]) * page_stride + (r % page_size) * row_stride;
  }
  bool contiguous() const { return pages == nullptr; }
};

inline RowsView rows_view(DType dtype, const detail::SeqTensor& t, int b, std::int64_t row_offset, int h) {
  return {dtype, t.data, row_index(t, b, row_offset, 0, h), t.seq_stride};
}

// The key rows of one KV head of sequence b (`t` is p.k or p.v), through kv_layout.hpp.
inline RowsView kv_rows_view(const detail::Problem& p, const detail::SeqTensor& t, int b, const Sequence& s, int h) {
  if (!p.kv.paged()) return {p.dtype, t.data, kv_index(p, t, b, s, 0, h), t.seq_stride};
  return {p.dtype, t.data, std::int64_t(h) * t.head_stride, t.seq_stride,
          p.kv.pages.block_table + b * p.kv.pages.table_stride, p.kv.pages.page_size, t.batch_stride, s.offset_k};
}

// dst[0, count) = src elements [index, index + count) as fp32. Each loop is branch-free so
// that the compiler vectorizes it (f16 subnormals, infinities and NaN included).
inline void convert_to_float(DType dtype, const void* base, std::int64_t index, int count, float* dst) {
  switch (dtype) {
    case DType::f32:
      std::memcpy(dst, static_cast<const float*>(base) + index, sizeof(float) * count);
      return;
    case DType::bf16: {
      const std::uint16_t* src = static_cast<const std::uint16_t*>(base) + index;
      for (int i = 0; i < count; ++i) dst[i] = detail::bits_to_float(std::uint32_t(src[i]) << 16);
      return;
    }
    default: {  // f16
      const std::uint16_t* src = static_cast<const std::uint16_t*>(base) + index;
      for (int i = 0; i < count; ++i) {
        const std::uint32_t h = src[i];
        const std::uint32_t magnitude = (h & 0x7fffu) << 13;
        // Reinterpreted as a float, the half's bits are off by 2^112 in the exponent bias;
        // the multiplication fixes normals and subnormals alike. Infinities and NaN keep their
        // mantissa through it and only need the exponent filled (an OR, not a branch, so that
        // the loop vectorizes).
        const std::uint32_t scaled = detail::float_to_bits(detail::bits_to_float(magnitude) * 0x1p112f);
        const std::uint32_t bits = scaled | (magnitude >= (0x7c00u << 13) ? 0x7f800000u : 0u);
        dst[i] = detail::bits_to_float(bits | ((h & 0x8000u) << 16));
      }
      return;
    }
  }
}

// Writes count values (times `scale`) rounded to the view's dtype.
inline void store_row(const RowsView& view, int row, const float* src, int count, float scale) {
  const std::int64_t index = view.at(row);
  if (view.dtype == DType::f32) {
    float* dst = static_cast<float*>(view.data) + index;
    for (int i = 0; i < count; ++i) dst[i] = src[i] * scale;
    return;
  }
  for (int i = 0; i < count; ++i) store(view.dtype, view.data, index + i, src[i] * scale);
}

// tile[r][0, width) = rows [row0, row0 + rows) of the view (width - head_dim zero columns);
// tile rows [rows, rows_padded) are zero.
inline void load_tile(const RowsView& view, int row0, int rows, int rows_padded, int head_dim, float* tile,
                      int width) {
  for (int r = 0; r < rows; ++r) {
    float* dst = tile + std::int64_t(r) * width;
    convert_to_float(view.dtype, view.data, view.at(row0 + r), head_dim, dst);
    std::fill(dst + head_dim, dst + width, 0.0f);
  }
  std::fill(tile + std::int64_t(rows) * width, tile + std::int64_t(rows_padded) * width, 0.0f);
}

// The transpose: tile[d][r] = scale * row (row0 + r), element d, for r < rows; zero for
// rows <= r < rows_padded (rows_padded is the tile's leading dimension). `scratch` holds one row.
inline void load_tile_transposed(const RowsView& view, int row0, int rows, int rows_padded, int head_dim,
                                 float scale, float* tile, float* scratch) {
  for (int r = 0; r < rows; ++r) {
    convert_to_float(view.dtype, view.data, view.at(row0 + r), head_dim, scratch);
    for (int d = 0; d < head_dim; ++d) tile[std::int64_t(d) * rows_padded + r] = scratch[d] * scale;
  }
  for (int d = 0; d < head_dim; ++d)
    std::fill(tile + std::int64_t(d) * rows_padded + rows, tile + std::int64_t(d + 1) * rows_padded, 0.0f);
}

// The keys a block of query rows may see. Visible ranges move right monotonically with the
// row (mask.hpp), so the block's keys are [first row's begin, last row's end), and a key block
// needs no per-element mask when every row of the block sees all of it.
template <int kRows>
struct QueryBlockKeys {
  int rows = 0;
  int key_begin = 0, key_end = 0;  // union over the block's rows, clipped to [0, seqlen_k)
  alignas(64) std::int32_t row_begin[kRows];
  alignas(64) std::int32_t row_end[kRows];  // padding rows see nothing

  QueryBlockKeys(const detail::Problem& p, const Sequence& s, int first_row, int row_count) : rows(row_count) {
    for (int r = 0; r < kRows; ++r) {
      const auto range = r < rows ? detail::visible_keys(first_row + r, s.rows_q, s.rows_k, p.window_left,
                                                          p.window_right)
                                  : detail::KeyRange{0, 0};
      row_begin[r] = std::max(range.begin, 0);
      row_end[r] = std::min(range.end, s.rows_k);
    }
    key_begin = row_begin[0];
    key_end = row_end[rows - 1];
  }

  bool empty() const { return key_begin >= key_end; }
  bool sees_all(int key0, int key1) const { return row_begin[rows - 1] <= key0 && row_end[0] >= key1; }
};

}  // namespace flashattn::cpu
