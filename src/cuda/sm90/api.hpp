#pragma once
// The sm90 family (FlashAttention-3 class: TMA, WGMMA, warp specialization): entry points that
// the dispatcher calls. Defined in launch.cuh, instantiated per (dtype, head dim).
#include "common/problem.hpp"
#include "cuda/common/head_columns.cuh"

namespace flashattn::cuda::sm90 {

// The extents of an operand laid out over the problem's query rows (`query_side`: Q, O, dO, dQ)
// or key rows (K, V, dK, dV): a variable-length batch is one packed sequence.
struct OperandExtent {
  long long rows;
  int heads, batch;
};
inline OperandExtent operand_extent(const detail::Problem& p, bool query_side) {
  const bool varlen = p.is_varlen();
  return {query_side ? (varlen ? p.total_q : p.seqlen_q) : (varlen ? p.total_k : p.seqlen_k),
          query_side ? p.heads_q : p.heads_kv, varlen ? 1 : p.batch};
}

// Whether TMA can read operand t: not where a stride of a dimension of several entries is zero
// (broadcast K/V), which TMA cannot express.
inline bool tma_readable(const detail::Problem& p, const detail::SeqTensor& t, bool query_side) {
  const OperandExtent e = operand_extent(p, query_side);
  return !((e.rows > 1 && t.seq_stride == 0) || (e.heads > 1 && t.head_stride == 0) ||
           (e.batch > 1 && t.batch_stride == 0));
}

// Whether the forward takes the problem's per-sequence key ranges (p.kv): none, or paged K/V
// (forward_paged_kv.cuh) with seqused_k and appended rows. Not k_start (cache_leftpad),
// batch_index (cache_batch_idx) or seqused_k over contiguous K/V: the whole-block loads would
// read the rows past a sequence's keys without zeroing them. Not paged K/V with dropout (no
// kernel has both). Those run on the sm80 family.
// Paged pools must be 16-byte aligned in their data and strides (TMA's rule; V's 16-byte
// cp.async pieces).
inline bool supports_kv(const detail::Problem& p) {
  if (!p.kv.any()) return true;
  auto pool_readable = [&](const detail::SeqTensor& t) {
    return vector_aligned(t, 2, p.kv.pages.page_size, p.heads_kv, p.kv.pages.num_pages);
  };
  return p.kv.paged() && p.kv.k_start == nullptr && p.kv.batch_index == nullptr && !p.dropout.enabled() &&
         pool_readable(p.k) && pool_readable(p.v);
}

// Whether this family handles the problem (features it does not cover fall back to sm80).
// Covered: f16/bf16, the built head dims (forward and backward 64/96/128/192/256), causal,
// sliding windows, softcap, GQA/MQA, variable length, LSE, any 16-byte-multiple strides, as long
// as TMA can read the operands it reads: the forward Q, K, V and (storing) O; the backward Q, K,
// V and dO (it reads O, and writes dQ/dK/dV, by plain loads and stores). Dropout and ALiBi
// both ways (the backward not the two together). Deterministic mode in the backward.
// Pointers and strides must be 16-byte multiples (TMA's rule, and the plain loads' and stores'
// 16-byte vectors), so the head dim a multiple of 8 (common/head_columns.cuh: `vectors`). The
// forward runs a head dim below its kernel's width: the TMA views have the head dim's extent, so
// loads zero-fill the columns past it and stores clip them. The backward takes only the widths
// (dispatch.cu). The forward's per-sequence key ranges: supports_kv.
inline bool supports_forward(const detail::ForwardProblem& p) {
  return tma_readable(p, p.q, true) && tma_readable(p, p.k, false) && tma_readable(p, p.v, false) &&
         tma_readable(p, p.out, true) && head_columns(p).vectors && supports_kv(p);
}

// Whether the FP8 forward can read the problem's operands: TMA-readable, the head dim a multiple of
// 16 and every pointer and followed stride a multiple of 16 bytes (1-byte Q, K, V; 2-byte out).
inline bool supports_fp8_forward(const detail::ForwardProblem& p) {
  auto aligned = [&](const detail::SeqTensor& t, int bytes, bool query_side) {
    const OperandExtent e = operand_extent(p, query_side);
    return tma_readable(p, t, query_side) && vector_aligned(t, bytes, e.rows, e.heads, e.batch);
  };
  return p.head_dim % 16 == 0 && aligned(p.q, 1, true) && aligned(p.k, 1, false) && aligned(p.v, 1, false) &&
         aligned(p.out, 2, true);
}

// Whether the sm90 backward splits the head dim between its consumer warpgroups at this head dim
// (backward_traits.cuh): their dK/dV no longer fit in registers otherwise.
constexpr bool backward_splits_head_dim(int head_dim) { return head_dim > 128; }

inline bool supports_backward(const detail::BackwardProblem& p) {
  return tma_readable(p, p.q, true) && tma_readable(p, p.k, false) && tma_readable(p, p.v, false) &&
         tma_readable(p, p.dout, true) && head_columns(p).vectors &&
         !(p.dropout.enabled() && p.alibi.enabled());  // no instance for the pair: sm80 runs it
}

template <class Element, int HeadDim>
void run_forward(const detail::ForwardProblem& problem);
template <class Element, int HeadDim>
void run_backward(const detail::BackwardProblem& problem);

}  // namespace flashattn::cuda::sm90
