#pragma once
// The sm80 family (FlashAttention-2 class: mma.sync, ldmatrix, cp.async): entry points that
// the dispatcher calls. Defined in launch.cuh, instantiated per (dtype, head dim).
#include "common/problem.hpp"

namespace flashattn::cuda::sm80 {

template <class Element, int HeadDim>
void run_forward(const detail::ForwardProblem& problem);
template <class Element, int HeadDim>
void run_backward(const detail::BackwardProblem& problem);

}  // namespace flashattn::cuda::sm80
