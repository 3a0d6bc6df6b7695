#pragma once
// The validated, normalized form of a call, which every backend consumes. The API layer
// (src/api) builds it after checking every argument; backends trust it.
#include <cstdint>

#include "common/alibi.hpp"
#include "common/host_device.hpp"
#include "common/kv_append.hpp"
#include "common/kv_layout.hpp"
#include "common/philox.hpp"
#include "common/seq_tensor.hpp"
#include "flashattn/attention.hpp"
#include "flashattn/tensor.hpp"

namespace flashattn::detail {

struct Problem {
  DType dtype = DType::f16;
  DeviceKind device = DeviceKind::cpu;
  int device_index = 0;
  void* stream = nullptr;
  int sm_margin = 0;  // SMs the persistent CUDA kernels leave free (AttentionOptions::sm_margin)

  int batch = 0;
  int heads_q = 0;
  int heads_kv = 0;
  int head_dim = 0;
  // Fixed length: every sequence's length. Variable length: the maxima (max_seqlen_*).
  int seqlen_q = 0;
  int seqlen_k = 0;
  // Variable length when non-null (batch + 1 offsets, in the tensors' memory space).
  const std::int32_t* cu_seqlens_q = nullptr;
  const std::int32_t* cu_seqlens_k = nullptr;
  // Variable length: the rows of the packed tensors (q and out: total_q; k and v: total_k), so
  // that kernels which address the packed tensor as a whole (TMA) know its extent. 0 otherwise.
  std::int64_t total_q = 0;
  std::int64_t total_k = 0;

  float scale = 1.0f;    // softmax scale
  float softcap = 0.0f;  // 0 = off
  // Normalized mask: -1 = unbounded side. causal implies window_right == 0.
  int window_left = -1;
  int window_right = -1;
  bool causal = false;
  DropoutParams dropout;  // dropout.enabled(): p > 0
  AlibiSlopes alibi;  // alibi.data == nullptr: no ALiBi

  SeqTensor q, k, v;
  // Where each sequence's keys come from (common/kv_layout.hpp): pages, per-sequence lengths,
  // starts and cache batches. Empty (kv.any() false) for plain calls; forward only.
  KvMap kv;

  bool is_varlen() const { return cu_seqlens_q != nullptr; }
  bool is_local() const { return window_left >= 0 || window_right >= 0; }
  int group_size() const { return heads_q / heads_kv; }  // query heads per KV head
};

// Descale factors of an FP8 operand (the FP8 forward): the operand's stored values times
// at(b, h) are the values it stands for, one float per (batch, KV head) at
// data + b * batch_stride + h * head_stride (strides 0: one per tensor). data null: 1.
struct Descale {
  const float* data = nullptr;
  std::int64_t batch_stride = 0;
  std::int64_t head_stride = 0;
  // Block quantization: blocks > 0 factors along a third axis, one per kFp8ScaleBlockRows rows.
  int blocks = 0;
  std::int64_t block_stride = 0;

  FA_HOST_DEVICE bool blocked() const { return blocks > 0; }
  // The factor of (b, h); blocked: of the block holding `row`. Callers pass rows of the sequence
  // (the FP8 kernel clamps its key chunks to the sequence's last key); a row past the last block
  // would take the last block's factor.
  FA_HOST_DEVICE float at(int b, int h, int row = 0) const {
    if (!data) return 1.f;
    const int block = blocks > 0 ? (row / kFp8ScaleBlockRows < blocks ? row / kFp8ScaleBlockRows : blocks - 1) : 0;
    return data[b * batch_stride + h * head_stride + block * block_stride];
  }
};

struct ForwardProblem : Problem {
  DType out_dtype = DType::f16;  // dtype unless q is e4m3 (then f16 or bf16)
  Descale q_descale, k_descale, v_descale;  // e4m3 only
  SeqTensor out;
  RowVector lse;  // lse.data == nullptr: not requested
  int num_splits = 0;  // split-KV count asked for by the caller; 0 = the backend's heuristic
  // A KV-cache call's append + rotary where the attention kernel itself does it (the sm80 decode
  // kernel: cuda/sm80/fused_append.cuh); empty otherwise, the append having run before.
  KvAppend fused_append;
};

struct BackwardProblem : Problem {
  SeqTensor out, dout;
  RowVector lse;
  SeqTensor dq, dk, dv;
  bool deterministic = false;
};

}  // namespace flashattn::detail
