#pragma once
// What the sm80 forward kernels read: the validated problem flattened into one plain struct,
// plus the launch plan's choices (GQA row packing, KV splits and their workspace).
#include <cstdint>

#include <cutlass/fast_math.h>

#include "common/host_device.hpp"
#include "common/kv_layout.hpp"
#include "common/problem.hpp"
#include "cuda/common/head_columns.cuh"
#include "cuda/common/tile_order.cuh"

namespace flashattn::cuda::sm80 {

struct ForwardParams {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  float* lse;  // null: not requested
  detail::SeqTensor q_layout, k_layout, v_layout, out_layout;
  detail::RowVector lse_layout;
  const std::int32_t* cu_seqlens_q;  // null unless variable length
  const std::int32_t* cu_seqlens_k;
  // Paged K/V and per-sequence key ranges (common/kv_layout.hpp); kv.any() false otherwise.
  detail::KvMap kv;
  cutlass::FastDivmod page_div;  // by kv.pages.page_size, when paged (sm80/paged_tiles.cuh)

  int batch, heads_q, heads_kv, group;
  int seqlen_q, seqlen_k;  // variable length: the maxima
  int window_left, window_right;
  // The problem's head dim and how its rows move (common/head_columns.cuh); kernels outside
  // ColumnMode::full read it.
  HeadColumns cols;

  // Softmax in logit units (see common/online_softmax.cuh): probabilities are
  // exp2(logit * scale_log2 - ...), LSE = max_logit * logit_scale + log(sum).
  // Without softcap the logit is score_sign * q.k; with softcap it is tanh(q.k * softcap_input).
  float scale_log2;
  float logit_scale;
  float softcap_input;  // scale / softcap; 0 = no softcap
  bool negate_scores;   // softmax scale < 0 without softcap: logits are -q.k
  // Dropout (common/philox.hpp), applied by the kernel instantiated with kDropout = true, which
  // runs with pack == 1 (a tile's rows are rows of one query head).
  detail::DropoutParams dropout;
  // ALiBi (common/alibi.hpp), null data: off. The bias is added to the logits divided by
  // logit_scale: alibi_to_logit = 1 / logit_scale.
  detail::AlibiSlopes alibi;
  float alibi_to_logit;

  // Query heads packed into the rows of one tile: 1, or `group` (then blockIdx.y is a KV head
  // and packed row r is query row r / pack of query head kv_head * group + r % pack).
  int pack;
  // Masked problems without splits: blockIdx.x indexes this order of (query block, head block,
  // batch) tiles: longest first, in sections of heads whose K/V share L2. Otherwise (no tiles)
  // the grid is (query block, head block, batch x split).
  TileOrder order;

  // Split-KV: split s of num_splits takes key tiles [s, s+1) * tiles_per_split (the last one
  // to the end) and writes fp32 partial outputs and LSEs, which a combine kernel merges.
  int num_splits;
  int tiles_per_split;
  float* partial_out;  // (splits, batch, heads_q, seqlen_q, head_dim)
  float* partial_lse;  // (splits, batch, heads_q, seqlen_q)

  // A KV-cache call's append + rotary, done by the kernel instantiated with kFusedAppend = true
  // (sm80/fused_append.cuh); empty for the others.
  detail::KvAppend fused_append;
};

// Where sequence b's rows are and how many there are.
// K/V rows: storage rows offset_k.. of K/V batch kv_batch, or of the sequence's pages.
struct SequenceSpan {
  int len_q, len_k;
  std::int64_t offset_q, offset_k;  // row offsets into packed variable-length tensors
  int kv_batch;
};

FA_HOST_DEVICE SequenceSpan sequence_span(const ForwardParams& p, int b) {
  SequenceSpan s{p.seqlen_q, p.seqlen_k, 0, 0, b};
  if (p.cu_seqlens_q != nullptr) {
    const int q0 = p.cu_seqlens_q[b], q1 = p.cu_seqlens_q[b + 1];
    const int k0 = p.cu_seqlens_k[b], k1 = p.cu_seqlens_k[b + 1];
    s = {q1 - q0, k1 - k0, q0, k0, b};
  }
  if (p.kv.any()) {
    const detail::KvSpan kv = detail::kv_span(p.kv, b, s.len_k, s.offset_k);
    s.len_k = kv.len_k;
    s.offset_k = kv.offset_k;
    s.kv_batch = kv.kv_batch;
  }
  return s;
}

// Index of element (b, row, h, 0) of a (batch, seq, heads, dim) operand.
FA_HOST_DEVICE std::int64_t element_index(const detail::SeqTensor& t, int b, std::int64_t row_offset,
                                          int row, int h) {
  return b * t.batch_stride + (row_offset + row) * t.seq_stride + std::int64_t(h) * t.head_stride;
}

FA_HOST_DEVICE std::int64_t lse_index(const detail::RowVector& r, int b, std::int64_t row_offset,
                                      int row, int h) {
  return b * r.batch_stride + std::int64_t(h) * r.head_stride + row_offset + row;
}

// Row of the split-KV workspace for (split, b, h, query row).
FA_HOST_DEVICE std::int64_t partial_row(const ForwardParams& p, int split, int b, int h, int row) {
  return ((std::int64_t(split) * p.batch + b) * p.heads_q + h) * p.seqlen_q + row;
}

}  // namespace flashattn::cuda::sm80
