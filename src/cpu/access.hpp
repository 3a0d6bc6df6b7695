#pragma once
// Element access and sequence geometry for the CPU backend.
#include <cstdint>

#include "common/numeric.hpp"
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

// Where sequence b's rows are and how many there are.
struct Sequence {
  int rows_q, rows_k;
  std::int64_t offset_q, offset_k;  // row offsets into packed (varlen) tensors; 0 otherwise
};

inline Sequence sequence(const detail::Problem& p, int b) {
  if (!p.is_varlen()) return {p.seqlen_q, p.seqlen_k, 0, 0};
  return {p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b], p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b],
          p.cu_seqlens_q[b], p.cu_seqlens_k[b]};
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
