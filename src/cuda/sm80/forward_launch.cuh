#pragma once
// Placeholder until the sm80 forward lands.
#include "cuda/sm80/api.hpp"
#include "flashattn/error.hpp"

namespace flashattn::cuda::sm80 {
template <class Element, int HeadDim>
void run_forward(const detail::ForwardProblem&) {
  throw Error(ErrorKind::unsupported, "backend", "an sm80 forward kernel", "not implemented yet");
}
}  // namespace flashattn::cuda::sm80
