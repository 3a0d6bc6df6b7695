#pragma once
// What the sm80 backward kernels read: the validated problem plus the workspace buffers.
#include <cstdint>

#include "common/host_device.hpp"
#include "common/problem.hpp"

namespace flashattn::cuda::sm80 {

struct BackwardParams {
  detail::SeqTensor q, k, v, out, dout, dq, dk, dv;
  detail::RowVector lse;
  const std::int32_t* cu_seqlens_q = nullptr;  // null: fixed length
  const std::int32_t* cu_seqlens_k = nullptr;

  int batch = 0, heads_q = 0, heads_kv = 0;
  int seqlen_q = 0, seqlen_k = 0;  // varlen: the maxima
  float scale = 1.0f;
  float softcap = 0.0f;            // 0 = off
  int window_left = -1, window_right = -1;

  // Workspace. Per-row vectors are [heads_q][dense_rows_q]; row r of sequence b is
  // SequenceRows::dense_q + r (common/sequence_rows.cuh).
  std::int64_t dense_rows_q = 0, dense_rows_k = 0;  // batch * seqlen_q, batch * seqlen_k
  float* lse_log2 = nullptr;  // LSE * log2(e); +inf where LSE is -inf (rows that see no key)
  float* delta = nullptr;     // D = rowsum(dO * O)
  // fp32 dQ accumulator [dense_rows_q + batch * dq_pad_rows][heads_q][head_dim]; null in
  // deterministic mode, where a separate kernel computes dQ without atomics. Each sequence's rows
  // are followed by dq_pad_rows (a query block) of padding, so that the main kernel adds whole
  // query blocks without testing rows against the sequence's end (the padding receives zeros).
  float* dq_accum = nullptr;
  int dq_pad_rows = 0;

  // Row of the dQ accumulator that holds row `row` of sequence b (dense_q: its first dense row).
  FA_HOST_DEVICE std::int64_t dq_accum_row(int b, std::int64_t dense_q, int row) const {
    return dense_q + std::int64_t(b) * dq_pad_rows + row;
  }

  // GQA: the query heads of one KV head are split into head_splits chunks, one CTA column each.
  // With more than one chunk, each writes fp32 partial dK/dV
  // [head_splits][dense_rows_k][heads_kv][head_dim], which a fixed-order reduction sums.
  int head_splits = 1;
  float* dk_partial = nullptr;
  float* dv_partial = nullptr;

  FA_HOST_DEVICE int group_size() const { return heads_q / heads_kv; }
};

}  // namespace flashattn::cuda::sm80
