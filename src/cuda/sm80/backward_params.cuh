#pragma once
// What the sm80 backward kernels read: the validated problem plus the workspace buffers.
#include <cstdint>

#include "common/host_device.hpp"
#include "common/problem.hpp"
#include "cuda/common/head_columns.cuh"

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
  detail::DropoutParams dropout;   // read by the kernels instantiated with kDropout
  // The problem's head dim and how its rows move (common/head_columns.cuh): every kernel below
  // reads and writes only columns < cols.dim of the operands (the workspace keeps the width's).
  HeadColumns cols{0, true};
  detail::AlibiSlopes alibi;  // null data: no ALiBi (common/alibi.hpp)

  // Workspace. Per-row vectors are [heads_q][dense_rows_q]; row r of sequence b is
  // SequenceRows::dense_q + r (common/sequence_rows.cuh).
  std::int64_t dense_rows_q = 0, dense_rows_k = 0;  // batch * seqlen_q, batch * seqlen_k
  float* lse_log2 = nullptr;  // LSE * log2(e); +inf where LSE is -inf (rows that see no key)
  float* delta = nullptr;     // D = rowsum(dO * O)
  // fp32 dQ accumulator, null in deterministic mode (a separate kernel computes dQ without
  // atomics there). Each sequence's rows start at a multiple of kDqBlock and are followed by
  // padding (dq_pad_rows), so that the main kernel adds whole query blocks without testing rows
  // against the sequence's end (the padding receives zeros). Rows come in groups of kDqBlock;
  // within a group, each head's head_dim columns are stored as kDqBlock x kDqBlock blocks, each
  // row-major: a warp's atomic for one m16n8 accumulator tile then covers 256 contiguous bytes
  // (two L2 lines) instead of touching eight rows' lines.
  float* dq_accum = nullptr;
  int dq_pad_rows = 0;
  // An fp32 accumulator the preprocess clears on its way (16-byte aligned; elements a multiple
  // of 4), so that clearing it costs no launch of its own and overlaps the preprocess's reads.
  float* zero_fill = nullptr;
  std::int64_t zero_fill_elements = 0;
  static constexpr int kDqBlock = 8;
  static_assert((kDqBlock & (kDqBlock - 1)) == 0, "dq_accum_row rounds down with a mask");
  // dq_pad_rows for a main kernel of block_m query rows: one query block. As block_m is a
  // multiple of kDqBlock, moving each sequence's start down to a multiple of kDqBlock never makes
  // it overlap the previous sequence's last block (tests/test_dq_accumulator.cpp).
  static constexpr int dq_pad_rows_for(int block_m) { return block_m; }

  // Row of the dQ accumulator that holds row `row` of sequence b (dense_q: its first dense row).
  FA_HOST_DEVICE std::int64_t dq_accum_row(int b, std::int64_t dense_q, int row) const {
    return (dense_q & ~std::int64_t(kDqBlock - 1)) + std::int64_t(b) * dq_pad_rows + row;
  }
  // Offset of (accumulator row, head, column) in dq_accum; kDqBlock consecutive columns from a
  // multiple of kDqBlock are contiguous.
  FA_HOST_DEVICE std::int64_t dq_accum_offset(std::int64_t row, int head, int col, int head_dim) const {
    constexpr int kB = kDqBlock;
    return ((row / kB * heads_q + head) * head_dim + col / kB * kB) * kB + row % kB * kB + col % kB;
  }
  // Elements to allocate for the accumulator (dq_pad_rows set).
  FA_HOST_DEVICE std::int64_t dq_accum_elements(int head_dim) const {
    return (dense_rows_q + std::int64_t(batch) * dq_pad_rows) * heads_q * head_dim;
  }
  // Distance between two groups of kDqBlock accumulator rows.
  FA_HOST_DEVICE std::int64_t dq_accum_group_stride(int head_dim) const {
    return std::int64_t(heads_q) * head_dim * kDqBlock;
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
