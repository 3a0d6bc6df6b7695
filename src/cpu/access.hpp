#pragma once
// Element access and sequence geometry for the CPU backend.
#include <cstdint>

#include "common/numeric.hpp"
#include "common/kv_layout.hpp"
#include "common/problem.hpp"

namespace flashattn::cpu {

inline float load(DType dtype, const void* base, std::int64_t index) {
  switch (dtype) {
    case DType::f16: return detail::half_to_float(static_cast<const std::uint16_t*>(base)[index]);
    case DType::bf16: return detail::bf16_to_float(static_cast<const std::uint16_t*>(base)[index]);
    default: return static_cast<const float*>(base)[index];
  }
}

inline void store(DType dtype, void* base, std::int64_t index, float value) {
  switch (dtype) {
    case DType::f16: static_cast<std::uint16_t*>(base)[index] = detail::float_to_half(value); break;
    case DType::bf16: static_cast<std::uint16_t*>(base)[index] = detail::float_to_bf16(value); break;
    default: static_cast<float*>(base)[index] = value; break;
  }
}

// Where sequence b's rows are and how many there are. K/V rows go through kv_layout.hpp:
// offset_k is a storage row of K/V batch kv_batch (or of the sequence's pages).
struct Sequence {
  int rows_q, rows_k;
  std::int64_t offset_q, offset_k;  // row offsets into packed (varlen) tensors; 0 otherwise
  int kv_batch = 0;                 // the batch of K/V (cache_batch_idx); b otherwise
};

inline Sequence sequence(const detail::Problem& p, int b) {
  Sequence s = !p.is_varlen()
                   ? Sequence{p.seqlen_q, p.seqlen_k, 0, 0, b}
                   : Sequence{p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b], p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b],
                              p.cu_seqlens_q[b], p.cu_seqlens_k[b], b};
  if (p.kv.any()) {
    const detail::KvSpan span = detail::kv_span(p.kv, b, s.rows_k, s.offset_k);
    s.rows_k = span.len_k;
    s.offset_k = span.offset_k;
    s.kv_batch = span.kv_batch;
  }
  return s;
}

// Index of element (key row, h, 0) of K or V (`t` is p.k or p.v) for sequence b.
inline std::int64_t kv_index(const detail::Problem& p, const detail::SeqTensor& t, int b, const Sequence& s, int row,
                             int h) {
  return detail::kv_element(p.kv.pages, t.batch_stride, t.seq_stride, t.head_stride, b, s.kv_batch,
                            s.offset_k + row, h);
}

// Index of element (b, row, h, 0) of a (batch, seq, heads, dim) operand; row counts from the
// sequence's first row.
inline std::int64_t row_index(const detail::SeqTensor& t, int b, std::int64_t row_offset, int row, int h) {
  return b * t.batch_stride + (row_offset + row) * t.seq_stride + std::int64_t(h) * t.head_stride;
}

inline std::int64_t lse_index(const detail::RowVector& r, int b, std::int64_t row_offset, int row, int h) {
  return b * r.batch_stride + std::int64_t(h) * r.head_stride + row_offset + row;
}

}  // namespace flashattn::cpu
