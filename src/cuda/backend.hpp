#pragma once
// The CUDA backend as the API layer sees it: takes validated problems, picks a kernel family.
#include "common/problem.hpp"

namespace flashattn::cuda {

void forward(const detail::ForwardProblem& problem);
void backward(const detail::BackwardProblem& problem);
bool device_available() noexcept;

}  // namespace flashattn::cuda
