#pragma once
// The CPU backend as the API layer sees it: validated problems in, results out.
#include <optional>

#include "common/problem.hpp"
#include "common/quantize.hpp"

namespace flashattn::cpu {

// Fast path: tiled online-softmax forward and FlashAttention-2 backward, fp32 accumulation,
// threaded over (batch, head, query block).
void forward(const detail::ForwardProblem& problem);
void backward(const detail::BackwardProblem& problem);

// x -> e4m3 and its descale factors (flashattn/fp8.hpp), the same bits as the CUDA kernel.
void quantize_e4m3(const detail::QuantizeProblem& problem);

// Float64 reference in plain loops (for tests and the command line's checks).
// With `round_to` set it becomes a same-precision baseline, an attention computed in that
// precision with float accumulation: the dot products QK^T and dO V^T accumulate in float, and
// P (in the backward also dP and dS) and the results are rounded to that dtype. Tests use its
// error to set their tolerance.
void reference_forward(const detail::ForwardProblem& problem,
                       std::optional<DType> round_to = std::nullopt);
void reference_backward(const detail::BackwardProblem& problem,
                        std::optional<DType> round_to = std::nullopt);

}  // namespace flashattn::cpu
