#pragma once
// Placeholder until the sm80 backward lands.
#include "cuda/sm80/api.hpp"
#include "flashattn/error.hpp"

namespace flashattn::cuda::sm80 {
template <class Element, int HeadDim>
void run_backward(const detail::BackwardProblem&) {
  throw Error(ErrorKind::unsupported, "backend", "an sm80 backward kernel", "not implemented yet");
}
}  // namespace flashattn::cuda::sm80
