#pragma once
// Where one sequence of a batch lives, for device code. Fixed-length batches address sequence b
// through batch_stride; variable-length ones through the cu_seqlens row offsets (problem.hpp).
#include <cstdint>

namespace flashattn::cuda {

struct SequenceRows {
  int len_q = 0, len_k = 0;           // this sequence's rows
  std::int64_t row_q = 0, row_k = 0;  // first row in packed (varlen) tensors; 0 for fixed length
  // First row in a dense row-indexed workspace of batch * seqlen rows (seqlen: the maximum).
  // Varlen offsets never exceed batch * max_seqlen, so both layouts fit the same workspace.
  std::int64_t dense_q = 0, dense_k = 0;
};

__device__ __forceinline__ SequenceRows sequence_rows(int b, int seqlen_q, int seqlen_k,
                                                      const std::int32_t* cu_seqlens_q,
                                                      const std::int32_t* cu_seqlens_k) {
  SequenceRows s;
  if (cu_seqlens_q != nullptr) {
    const int q0 = cu_seqlens_q[b], k0 = cu_seqlens_k[b];
    s.len_q = cu_seqlens_q[b + 1] - q0;
    s.len_k = cu_seqlens_k[b + 1] - k0;
    s.row_q = s.dense_q = q0;
    s.row_k = s.dense_k = k0;
  } else {
    s.len_q = seqlen_q;
    s.len_k = seqlen_k;
    s.dense_q = std::int64_t(b) * seqlen_q;
    s.dense_k = std::int64_t(b) * seqlen_k;
  }
  return s;
}

}  // namespace flashattn::cuda
