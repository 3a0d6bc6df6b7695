#pragma once
// The sm90 family (FlashAttention-3 class: TMA, WGMMA, warp specialization): entry points that
// the dispatcher calls. Defined in launch.cuh, instantiated per (dtype, head dim).
#include "common/problem.hpp"

namespace flashattn::cuda::sm90 {

// Whether this family handles the problem (features it does not cover fall back to sm80).
// Covered: f16/bf16, head dims 64/96/128/192/256 (the built instances), causal, sliding
// windows, softcap, GQA/MQA, variable length, LSE, any 16-byte-multiple strides. Not covered:
// a zero stride over a dimension of several entries (broadcast K/V), which TMA cannot express.
inline bool supports_forward(const detail::ForwardProblem& problem) {
  auto broadcast = [](const detail::SeqTensor& t, long long rows, int heads, int batch) {
    return (rows > 1 && t.seq_stride == 0) || (heads > 1 && t.head_stride == 0) ||
           (batch > 1 && t.batch_stride == 0);
  };
  const bool varlen = problem.is_varlen();
  const long long rows_q = varlen ? problem.total_q : problem.seqlen_q;
  const long long rows_k = varlen ? problem.total_k : problem.seqlen_k;
  const int batch = varlen ? 1 : problem.batch;
  return !broadcast(problem.q, rows_q, problem.heads_q, batch) &&
         !broadcast(problem.k, rows_k, problem.heads_kv, batch) &&
         !broadcast(problem.v, rows_k, problem.heads_kv, batch) &&
         !broadcast(problem.out, rows_q, problem.heads_q, batch);
}

// The backward: the same, for its own operands (dO, and dQ/dK/dV written by plain stores).
inline bool supports_backward(const detail::BackwardProblem& problem) {
  auto broadcast = [](const detail::SeqTensor& t, long long rows, int heads, int batch) {
    return (rows > 1 && t.seq_stride == 0) || (heads > 1 && t.head_stride == 0) ||
           (batch > 1 && t.batch_stride == 0);
  };
  const bool varlen = problem.is_varlen();
  const long long rows_q = varlen ? problem.total_q : problem.seqlen_q;
  const long long rows_k = varlen ? problem.total_k : problem.seqlen_k;
  const int batch = varlen ? 1 : problem.batch;
  return !broadcast(problem.q, rows_q, problem.heads_q, batch) &&
         !broadcast(problem.k, rows_k, problem.heads_kv, batch) &&
         !broadcast(problem.v, rows_k, problem.heads_kv, batch) &&
         !broadcast(problem.dout, rows_q, problem.heads_q, batch);
}

template <class Element, int HeadDim>
void run_forward(const detail::ForwardProblem& problem);
template <class Element, int HeadDim>
void run_backward(const detail::BackwardProblem& problem);

}  // namespace flashattn::cuda::sm90
