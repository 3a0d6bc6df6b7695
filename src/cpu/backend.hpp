#pragma once
// The CPU backend as the API layer sees it: validated problems in, results out.
#include "common/problem.hpp"

namespace flashattn::cpu {

// Fast path: tiled online-softmax forward and FlashAttention-2 backward, fp32 accumulation,
// threaded over (batch, head, query block).
void forward(const detail::ForwardProblem& problem);
void backward(const detail::BackwardProblem& problem);

// Float64 reference in plain loops (for tests and the command line's checks).
void reference_forward(const detail::ForwardProblem& problem);
void reference_backward(const detail::BackwardProblem& problem);

}  // namespace flashattn::cpu
