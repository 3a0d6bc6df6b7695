#pragma once
// The sm90 family (FlashAttention-3 class: TMA, WGMMA, warp specialization): entry points that
// the dispatcher calls. Defined in launch.cuh, instantiated per (dtype, head dim).
#include "common/problem.hpp"

namespace flashattn::cuda::sm90 {

// Whether this family handles the problem (features it does not cover fall back to sm80).
inline bool supports_forward(const detail::ForwardProblem& problem) {
  (void)problem;
  return true;
}

template <class Element, int HeadDim>
void run_forward(const detail::ForwardProblem& problem);

}  // namespace flashattn::cuda::sm90
