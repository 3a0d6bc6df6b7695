#pragma once
// Checks every argument of a call and builds the normalized problem the backends run.
// Throws flashattn::Error naming the first bad argument; reads tensor contents only for
// CPU-resident cu_seqlens.
#include "common/problem.hpp"
#include "common/quantize.hpp"
#include "flashattn/attention.hpp"
#include "flashattn/fp8.hpp"

namespace flashattn::detail {

ForwardProblem make_forward_problem(const ForwardArgs& args);
BackwardProblem make_backward_problem(const BackwardArgs& args);
QuantizeProblem make_quantize_problem(const QuantizeArgs& args);

}  // namespace flashattn::detail
