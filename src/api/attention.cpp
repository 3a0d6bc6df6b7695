// Public entry points: validate, then hand the normalized problem to the tensors' backend.
#include "flashattn/attention.hpp"

#include "api/kv_cache.hpp"
#include "api/validate.hpp"
#include "cpu/backend.hpp"
#include "flashattn/error.hpp"
#include "flashattn/fp8.hpp"
#include "flashattn/reference.hpp"
#ifdef FLASHATTN_WITH_CUDA
#include "cuda/backend.hpp"
#endif

namespace flashattn {

void forward(const ForwardArgs& args) {
  const detail::ForwardProblem problem = detail::make_forward_problem(args);
  if (problem.device == DeviceKind::cpu) return cpu::forward(problem);
#ifdef FLASHATTN_WITH_CUDA
  cuda::forward(problem);
#endif
}

void backward(const BackwardArgs& args) {
  const detail::BackwardProblem problem = detail::make_backward_problem(args);
  if (problem.device == DeviceKind::cpu) return cpu::backward(problem);
#ifdef FLASHATTN_WITH_CUDA
  cuda::backward(problem);
#endif
}

void quantize_e4m3(const QuantizeArgs& args) {
  const detail::QuantizeProblem problem = detail::make_quantize_problem(args);
  if (problem.device == DeviceKind::cpu) return cpu::quantize_e4m3(problem);
#ifdef FLASHATTN_WITH_CUDA
  cuda::quantize_e4m3(problem);
#endif
}

void forward_kvcache(const KvCacheArgs& args) {
  detail::KvCachePlan plan = detail::make_kvcache_plan(args);
  if (plan.problem.device == DeviceKind::cpu) return detail::run_kvcache_cpu(plan, /*reference=*/false);
#ifdef FLASHATTN_WITH_CUDA
  cuda::forward_kvcache(plan.problem, plan.append);
#endif
}

bool built_with_cuda() noexcept {
#ifdef FLASHATTN_WITH_CUDA
  return true;
#else
  return false;
#endif
}

bool cuda_available() noexcept {
#ifdef FLASHATTN_WITH_CUDA
  return cuda::device_available();
#else
  return false;
#endif
}

namespace reference {

static void require_cpu(const TensorView& q) {
  if (q.device != DeviceKind::cpu)
    throw Error(ErrorKind::invalid_type, "q.device", "cpu (the reference runs on the CPU)",
                to_string(q.device));
}

void forward(const ForwardArgs& args) {
  require_cpu(args.q);
  cpu::reference_forward(detail::make_forward_problem(args));
}

void quantize_e4m3(const QuantizeArgs& args) {
  const detail::QuantizeProblem problem = detail::make_quantize_problem(args);
  if (problem.device == DeviceKind::cpu) return cpu::quantize_e4m3(problem);
#ifdef FLASHATTN_WITH_CUDA
  cuda::quantize_e4m3(problem);
#endif
}

void forward_kvcache(const KvCacheArgs& args) {
  require_cpu(args.q);
  detail::KvCachePlan plan = detail::make_kvcache_plan(args);
  detail::run_kvcache_cpu(plan, /*reference=*/true);
}

void backward(const BackwardArgs& args) {
  require_cpu(args.q);
  cpu::reference_backward(detail::make_backward_problem(args));
}

}  // namespace reference
}  // namespace flashattn
