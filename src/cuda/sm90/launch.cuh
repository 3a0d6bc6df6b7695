#pragma once
// Placeholder until the sm90 forward lands.
#include "cuda/sm90/api.hpp"
#include "flashattn/error.hpp"

namespace flashattn::cuda::sm90 {
template <class Element, int HeadDim>
void run_forward(const detail::ForwardProblem&) {
  throw Error(ErrorKind::unsupported, "backend", "an sm90 forward kernel", "not implemented yet");
}
}  // namespace flashattn::cuda::sm90
