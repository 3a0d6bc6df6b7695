#pragma once
// Exact attention, forward and backward.
//
// Layout: q (batch, seqlen_q, heads_q, head_dim), k and v (batch, seqlen_k, heads_kv, head_dim),
// any strides with a contiguous last dimension. Variable-length batches pack the sequences
// along one dimension instead: q (total_q, heads_q, head_dim) with cu_seqlens_q (batch + 1,
// int32) holding the offsets, as flash-attn does. heads_q must be a multiple of heads_kv
// (GQA/MQA); no copies of K/V are made.
//
// LSE (log-sum-exp of the scaled scores, natural log, float32) is (batch, heads_q, seqlen_q),
// or (heads_q, total_q) for variable length. A query row that sees no key (fully masked, or
// seqlen_k = 0) gets output 0 and LSE -inf.
//
// The backend follows the tensors' device: CPU tensors run on the CPU backend, CUDA tensors on
// the CUDA backend, asynchronously on `stream` (a cudaStream_t; null = default stream). GPU
// entry points never synchronize. Every argument is validated first; on error a
// flashattn::Error is thrown and nothing is written.
#include <cstdint>
#include <optional>

#include "flashattn/tensor.hpp"

namespace flashattn {

// Rows of Q or K that share one descale factor under block quantization (ForwardArgs, fp8.hpp).
inline constexpr int kFp8ScaleBlockRows = 128;
// The descale factors of `rows` rows under block quantization: ceil(rows / kFp8ScaleBlockRows).
constexpr std::int64_t fp8_scale_blocks(std::int64_t rows) {
  return rows > 0 ? (rows + kFp8ScaleBlockRows - 1) / kFp8ScaleBlockRows : 0;
}

// Options shared by the forward and the backward pass.
struct AttentionOptions {
  std::optional<float> softmax_scale;  // default 1/sqrt(head_dim)
  // Causal masking, aligned to the bottom-right corner when seqlen_q != seqlen_k
  // (query i sees keys j <= i + seqlen_k - seqlen_q), as flash-attn >= 2.1.
  bool causal = false;
  // Sliding window, same alignment: query i sees keys in
  // [i + seqlen_k - seqlen_q - window_left, i + seqlen_k - seqlen_q + window_right];
  // -1 leaves a side unbounded, and so does a size >= seqlen_k (flash-attn's rule; under
  // variable length, max_seqlen_k). causal sets window_right = 0 whatever is given, as
  // flash-attn does; window_left still applies.
  int window_left = -1;
  int window_right = -1;
  // Soft-capping: scores become softcap * tanh(scale * q.k / softcap). 0 = off.
  float softcap = 0.0f;
  // ALiBi (optional): float32 slopes of shape (heads_q,) or (batch, heads_q), last dimension
  // contiguous, on q's device. The score of query i and key j (after scale and softcap) gains
  //   -slope[b, h] * |i + seqlen_k - seqlen_q - j|
  // with the sequence's own lengths under variable length, as flash-attn does. It never masks.
  // Not differentiated: the backward gives no gradient for the slopes.
  TensorView alibi_slopes;
  // Variable length: both present or both absent. int32, batch + 1 entries, same device as q.
  // On the CPU their contents are checked; device-resident offsets are trusted.
  TensorView cu_seqlens_q;
  TensorView cu_seqlens_k;
  int max_seqlen_q = 0;  // required with cu_seqlens: the longest sequence
  int max_seqlen_k = 0;
  // Dropout on the attention probabilities: each entry of P is dropped with probability
  // round(256 dropout_p) / 256 (dropout_p in [0, 1); 0 = off; one random byte an entry, as
  // flash-attn draws it) and the kept ones are scaled by 1 / (1 - dropout_p), for the
  // P V product only (the LSE is that of the undropped scores). Which entries drop is a pure
  // function of (dropout_seed, dropout_offset, sequence, query head, query row, key), the same
  // on every backend (src/common/philox.hpp); the backward must get the forward's values.
  // dropout_state, when given (int64, shape [2], in q's memory), holds (seed, offset) instead
  // and is read when the call runs, so that a CUDA graph may refill it between replays.
  // A call draws offsets [dropout_offset, dropout_offset + batch * heads_q * 32): a caller that
  // advances the offset by that much per call never repeats a random number.
  float dropout_p = 0.0f;
  std::uint64_t dropout_seed = 0;
  std::uint64_t dropout_offset = 0;
  TensorView dropout_state;
  void* stream = nullptr;  // cudaStream_t for CUDA tensors
  // CUDA: streaming multiprocessors that the persistent (sm90) kernels leave free for kernels
  // running beside them on other streams, such as a communication library's (whose kernels
  // cannot start on an SM these kernels fill). >= 0; at least one SM is always used. The sm80
  // kernels, whose CTAs come and go, ignore it; so does the CPU.
  int sm_margin = 0;
};

struct ForwardArgs : AttentionOptions {
  TensorView q, k, v;
  TensorView out;  // same shape and dtype as q
  TensorView lse;  // optional, float32
  // Paged K/V for variable-length calls (chunked prefill over a paged cache; forward only):
  // k and v are (num_blocks, page_size, heads_kv, head_dim), block_table (batch, max_blocks)
  // int32 names the pages of each sequence, whose keys are its first
  // cu_seqlens_k[b + 1] - cu_seqlens_k[b] rows (or seqused_k[b]). page_size: a multiple of 16
  // from 16 to 512. See flashattn/kv_cache.hpp for the KV-cache call.
  TensorView block_table;
  // Variable length, optional (int32, batch entries): sequence b uses only its first
  // seqused_k[b] keys (ALiBi's seqlen_k is then seqused_k[b]).
  TensorView seqused_k;
  // FP8: q, k and v of dtype e4m3 (CUDA, Hopper; forward only; no dropout, ALiBi or paged K/V),
  // out f16 or bf16. Each stored value times its descale factor is the value it stands for:
  // float32 of shape (batch, heads_kv) (any strides; stride 0 repeats a factor) or (1,) for one
  // per tensor; absent: 1. q_descale[b, h] applies to every query head of KV head h.
  // Block quantization (q_descale and k_descale only): (batch, heads_kv, blocks), one factor per
  // block of kFp8ScaleBlockRows rows of each sequence (row i in block i / kFp8ScaleBlockRows),
  // blocks = ceil(seqlen / kFp8ScaleBlockRows) (varlen: of max_seqlen; a sequence's blocks past its
  // own rows are not read). v_descale has no blocks: V's factor multiplies the output once.
  TensorView q_descale, k_descale, v_descale;
};

struct BackwardArgs : AttentionOptions {
  TensorView q, k, v;
  TensorView out;   // the forward's output
  TensorView dout;  // gradient of the loss w.r.t. out
  TensorView lse;   // the forward's LSE (required)
  TensorView dq, dk, dv;  // written (not accumulated into); shapes of q, k, v
  bool deterministic = false;  // same bits on every run (may be slower)
};

void forward(const ForwardArgs& args);
void backward(const BackwardArgs& args);

// Which backends this build contains, and whether a CUDA device is usable now.
bool built_with_cuda() noexcept;
bool cuda_available() noexcept;

}  // namespace flashattn
