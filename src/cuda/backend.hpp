#pragma once
// The CUDA backend as the API layer sees it: takes validated problems, picks a kernel family.
#include "common/kv_append.hpp"
#include "common/problem.hpp"
#include "common/quantize.hpp"

namespace flashattn::cuda {

void forward(const detail::ForwardProblem& problem);
void backward(const detail::BackwardProblem& problem);
// A KV-cache call: the append + rotary step (cuda/kv_append.cuh), then the attention over the
// cache. Checks that a kernel is built for the problem before anything is written.
void forward_kvcache(const detail::ForwardProblem& problem, const detail::KvAppend& append);
// x -> e4m3 and its descale factors (cuda/quantize.cu).
void quantize_e4m3(const detail::QuantizeProblem& problem);
bool device_available() noexcept;

}  // namespace flashattn::cuda
