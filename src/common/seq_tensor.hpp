#pragma once
// How the backends address a call's operands: (batch, seq, head, dim) tensors and per-row
// float vectors, strides in elements (common/problem.hpp says what each operand is).
#include <cstdint>

namespace flashattn::detail {

// One (batch, seq, head, dim) operand. Element (b, i, h, d) of sequence b lives at
//   data + b * batch_stride + (row_offset(b) + i) * seq_stride + h * head_stride + d
// where row_offset(b) is cu_seqlens[b] for variable length (batch_stride = 0) and 0 otherwise.
struct SeqTensor {
  void* data = nullptr;
  std::int64_t batch_stride = 0;
  std::int64_t seq_stride = 0;
  std::int64_t head_stride = 0;
};

// LSE (and any per-row float vector): element (b, h, i) lives at
//   data + b * batch_stride + h * head_stride + row_offset(b) + i
struct RowVector {
  float* data = nullptr;
  std::int64_t batch_stride = 0;
  std::int64_t head_stride = 0;
};

}  // namespace flashattn::detail
