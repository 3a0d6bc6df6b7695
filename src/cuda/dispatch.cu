// Chooses the kernel family and instance for a validated problem.
//
// Hopper (compute capability 9.0) runs the sm90 family where it is built, supports the
// problem and is the faster family (not for decoding: see kDecodeMaxQueryRows); every GPU from
// sm80 runs the sm80 family otherwise. FLASHATTN_CUDA_FAMILY=sm80 or
// sm90 in the environment forces one family (for benchmarks and tests).
#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include <cutlass/numeric_types.h>

#include "cuda/backend.hpp"
#include "cuda/common/check.cuh"
#include "cuda/common/stream_workspace.cuh"
#include "cuda/kv_append.cuh"
#include "cuda/sm80/api.hpp"
#include "cuda/sm80/forward_heuristics.hpp"
#include "cuda/sm90/api.hpp"

namespace flashattn::cuda {
namespace {

enum class Family { sm80, sm90 };

const char* name(Family f) { return f == Family::sm80 ? "sm80" : "sm90"; }

// Makes the tensors' device current for the call and restores the caller's afterwards.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    FA_CUDA_CHECK(cudaGetDevice(&previous_));
    if (device != previous_) FA_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

// Queried once per device: the per-call host cost matters for small problems.
int compute_capability(int device) {
  static std::atomic<int> cache[64] = {};
  if (device >= 0 && device < 64 && cache[device].load(std::memory_order_relaxed))
    return cache[device].load(std::memory_order_relaxed);
  int major = 0, minor = 0;
  FA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  FA_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  if (device >= 0 && device < 64) cache[device].store(major * 10 + minor, std::memory_order_relaxed);
  return major * 10 + minor;
}

// Read once per process.
const char* forced_family() {
  static const char* forced = [] {
    const char* env = std::getenv("FLASHATTN_CUDA_FAMILY");
    return (env && *env && std::strcmp(env, "auto") != 0) ? env : nullptr;
  }();
  return forced;
}

// What this build contains (from the generated instance list).
bool built(Family family, const char* direction, DType dtype, int head_dim) {
  [[maybe_unused]] const char* fam = name(family);
  [[maybe_unused]] const char* dt = dtype == DType::f16    ? "f16"
                                    : dtype == DType::bf16 ? "bf16"
                                    : dtype == DType::e4m3 ? "e4m3"
                                                           : "";
#define FA_INSTANCE(f, dir, d, hd)                                                          \
  if (std::strcmp(fam, #f) == 0 && std::strcmp(direction, #dir) == 0 &&                    \
      std::strcmp(dt, #d) == 0 && head_dim == hd)                                            \
    return true;
#include "flashattn_instances.inc"
#undef FA_INSTANCE
  return false;
}

// The kernel width that serves a head dim: the smallest built width >= head_dim (columns past
// the head dim are predicated off: common/head_columns.cuh); 0 if none is built.
constexpr int kWidths[] = {32, 64, 96, 128, 192, 256};
int instance_width(Family family, const char* direction, DType dtype, int head_dim) {
  for (int width : kWidths)
    if (width >= head_dim && built(family, direction, dtype, width)) return width;
  return 0;
}

std::string built_head_dims(Family family, const char* direction, DType dtype) {
  std::string list;
  for (int hd : {32, 64, 96, 128, 192, 256})
    if (built(family, direction, dtype, hd)) list += (list.empty() ? "" : ", ") + std::to_string(hd);
  return list.empty() ? "none" : list;
}

[[noreturn]] void throw_not_built(const detail::Problem& p, const char* direction, int cc) {
  if (p.dtype != DType::f16 && p.dtype != DType::bf16)
    throw Error(ErrorKind::unsupported, "q.dtype", "f16 or bf16 on the CUDA backend",
                to_string(p.dtype));
  if (cc < 80)
    throw Error(ErrorKind::unsupported, "device",
                "a GPU of compute capability 8.0 or newer", "compute capability " +
                                                                  std::to_string(cc));
  throw Error(ErrorKind::unsupported, "head_dim",
              std::string("a head dim up to the widest built ") + direction + " kernel for " +
                  to_string(p.dtype) + " on the CUDA backend (built widths: " +
                  built_head_dims(Family::sm80, direction, p.dtype) + "; every head dim up to a width runs on it)",
              std::to_string(p.head_dim));
}

using Element_f16 = cutlass::half_t;
using Element_bf16 = cutlass::bfloat16_t;
using Element_e4m3 = cutlass::float_e4m3_t;

// Runs the generated instance for (family, dtype, head dim); false if this build has none.
// Only instances listed in flashattn_instances.inc are referenced, so a narrowed kernel set
// still links.
bool run_instance(Family family, int width, const detail::ForwardProblem& p) {
#define FA_CALL_forward(f, d, hd)                                                   \
  if (family == Family::f && p.dtype == DType::d && width == hd) {                 \
    f::run_forward<Element_##d, hd>(p);                                            \
    return true;                                                                    \
  }
#define FA_CALL_backward(f, d, hd)
#define FA_INSTANCE(f, dir, d, hd) FA_CALL_##dir(f, d, hd)
#include "flashattn_instances.inc"
#undef FA_INSTANCE
#undef FA_CALL_forward
#undef FA_CALL_backward
  return false;
}

bool run_instance(Family family, int width, const detail::BackwardProblem& p) {
#define FA_CALL_forward(f, d, hd)
#define FA_CALL_backward(f, d, hd)                                                  \
  if (family == Family::f && p.dtype == DType::d && width == hd) {                 \
    f::run_backward<Element_##d, hd>(p);                                           \
    return true;                                                                    \
  }
#define FA_INSTANCE(f, dir, d, hd) FA_CALL_##dir(f, d, hd)
#include "flashattn_instances.inc"
#undef FA_INSTANCE
#undef FA_CALL_forward
#undef FA_CALL_backward
  return false;
}

// The family and the kernel width that run a problem.
struct Choice {
  Family family;
  int width;
};

// sm90_supports: the sm90 family can run the problem; sm90_preferred: and it is the faster
// family for it (FLASHATTN_CUDA_FAMILY=sm90 still forces it where it is merely supported).
// sm90_exact_width: the sm90 kernels of this direction take only head dims that are a width
// (the sm90 backward; the sm90 forward takes smaller head dims through TMA's zero fill).
// Unforced, sm90 is not preferred where it would run a wider kernel than sm80 (head dims up to
// 32: sm90 has no width 32).
Choice choose_family(const detail::Problem& p, const char* direction, int cc, bool sm90_supports,
                     bool sm90_preferred, bool sm90_exact_width) {
  const int width90 = cc == 90 ? instance_width(Family::sm90, direction, p.dtype, p.head_dim) : 0;
  const int width80 = cc >= 80 ? instance_width(Family::sm80, direction, p.dtype, p.head_dim) : 0;
  const bool sm90_runs = width90 != 0 && sm90_supports && (!sm90_exact_width || width90 == p.head_dim);
  const char* forced = forced_family();
  if (forced && std::strcmp(forced, "sm90") == 0) {
    if (!sm90_runs)
      throw Error(ErrorKind::unsupported, "FLASHATTN_CUDA_FAMILY",
                  "a family that is built and supports this problem on this GPU", "sm90");
    return {Family::sm90, width90};
  }
  const bool allow_sm90 = !(forced && std::strcmp(forced, "sm80") == 0);
  if (allow_sm90 && sm90_runs && sm90_preferred && (width80 == 0 || width90 <= width80))
    return {Family::sm90, width90};
  if (width80 != 0) return {Family::sm80, width80};
  // A build without the sm80 family still runs what sm90 supports but is not preferred for
  // (decoding, for one).
  if (allow_sm90 && sm90_runs) return {Family::sm90, width90};
  throw_not_built(p, direction, cc);
}

}  // namespace

// Decoding (a few query rows against a long KV cache) is bandwidth-bound: the sm80 family
// packs a GQA group's query heads into one tile and splits the keys over CTAs (flash-decoding);
// the sm90 kernel has neither. On an H100 (b=8, 32/8 heads, d=128, KV 4k-128k) sm90 read the
// KV cache at 1.2-1.4 TB/s (bench/results/gpu_2026-11-23_h100_side_by_side.json), sm80 at
// 1.25-2.99 TB/s in an earlier run (docs/log/sm80-forward.md).
constexpr int kDecodeMaxQueryRows = 16;

// Dropout with softcap: not on the GPU (flash-attn 2 rejects the pair too); the CPU has both.
void check_dropout(const detail::Problem& p) {
  if (p.dropout.enabled() && p.softcap > 0)
    throw Error(ErrorKind::unsupported, "dropout_p",
                "0 with softcap > 0 on the CUDA backend (dropout with soft-capping is not built there)",
                std::to_string(p.dropout.p));
}

// e4m3 inputs: the sm90 forward alone (docs/kernels/fp8-forward.md); validation has rejected
// what it never takes (dropout, ALiBi, paged K/V, the backward).
void forward_fp8(const detail::ForwardProblem& p, int cc) {
  const char* forced = forced_family();
  if (forced && std::strcmp(forced, "sm90") != 0)
    throw Error(ErrorKind::unsupported, "FLASHATTN_CUDA_FAMILY", "sm90 or unset with e4m3 inputs", forced);
  if (cc != 90)
    throw Error(ErrorKind::unsupported, "q.dtype",
                "f16 or bf16 on this GPU (e4m3 runs on Hopper, compute capability 9.0)",
                "e4m3 on compute capability " + std::to_string(cc));
  const int width = instance_width(Family::sm90, "forward", DType::e4m3, p.head_dim);
  if (width == 0)
    throw Error(ErrorKind::unsupported, "head_dim",
                "a head dim up to the widest built e4m3 forward (built widths: " +
                    built_head_dims(Family::sm90, "forward", DType::e4m3) + ")",
                std::to_string(p.head_dim));
  if (!sm90::supports_fp8_forward(p))
    throw Error(ErrorKind::unsupported, "q, k, v, out",
                "with e4m3 inputs: a head dim that is a multiple of 16, pointers and strides that are multiples of "
                "16 bytes and no broadcast (zero-stride) dimension",
                "head_dim " + std::to_string(p.head_dim) + " or an unaligned operand");
  if (!run_instance(Family::sm90, width, p)) throw_not_built(p, "forward", cc);
}

void forward(const detail::ForwardProblem& p) {
  check_dropout(p);
  DeviceGuard guard(p.device_index);
  const int cc = compute_capability(p.device_index);
  if (p.dtype == DType::e4m3) return forward_fp8(p, cc);
  const bool decoding = p.seqlen_q <= kDecodeMaxQueryRows;
  // Per-sequence key ranges (p.kv): the sm90 forward takes paged K/V (sm90/forward_paged_kv.cuh);
  // cache_leftpad and cache_batch_idx run on the sm80 family (sm90/api.hpp: supports_kv).
  const Choice c = choose_family(p, "forward", cc, sm90::supports_forward(p), !decoding, false);
  if (!run_instance(c.family, c.width, p)) throw_not_built(p, "forward", cc);
}

void forward_kvcache(const detail::ForwardProblem& problem, const detail::KvAppend& append) {
  DeviceGuard guard(problem.device_index);
  const int cc = compute_capability(problem.device_index);
  // The family first: an unbuilt kernel is reported before the cache is written. As in forward:
  // decoding runs on the sm80 family, more query rows over a paged cache on sm90 where it runs.
  const bool decoding = problem.seqlen_q <= kDecodeMaxQueryRows;
  const Choice c = choose_family(problem, "forward", cc, sm90::supports_forward(problem), !decoding, false);
  // The sm80 grid's limits (sm80/forward_launch.cuh), checked here too: after the append the
  // cache has been written.
  if (c.family == Family::sm80 && (problem.batch > 65535 || problem.heads_q > 65535))
    throw Error(ErrorKind::unsupported, problem.batch > 65535 ? "batch" : "heads",
                "at most 65535 on the sm80 forward's grid",
                std::to_string(problem.batch > 65535 ? problem.batch : problem.heads_q));
  detail::ForwardProblem p = problem;
  if (c.family == Family::sm80 && sm80::fuses_kv_append(p, c.width, append)) {
    p.fused_append = append;  // the decode kernel appends and rotates itself (sm80/fused_append.cuh)
    if (!run_instance(c.family, c.width, p)) throw_not_built(p, "forward", cc);
    return;
  }
  cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  const std::size_t q_bytes = append.rotates() ? std::size_t(p.batch) * p.seqlen_q * p.heads_q * p.head_dim *
                                                     element_size(p.dtype)
                                               : 0;
  WorkspacePlan plan;
  const std::size_t q_offset = plan.add<char>(q_bytes);
  StreamWorkspace workspace(plan.bytes(), stream);  // freed in stream order after the attention
  void* q_rotated = q_bytes ? workspace.at<char>(q_offset) : nullptr;
  launch_kv_append(p, append, q_rotated);
  if (q_rotated != nullptr)
    p.q = {q_rotated, std::int64_t(p.seqlen_q) * p.heads_q * p.head_dim, std::int64_t(p.heads_q) * p.head_dim,
           p.head_dim};
  if (!run_instance(c.family, c.width, p)) throw_not_built(p, "forward", cc);
}

void backward(const detail::BackwardProblem& p) {
  check_dropout(p);
  DeviceGuard guard(p.device_index);
  const int cc = compute_capability(p.device_index);
  // Hopper runs the sm90 backward at the head dims it has (sm90/backward_traits.cuh), exactly;
  // the others, and every other GPU, the sm80 family's.
  const Choice c = choose_family(p, "backward", cc, sm90::supports_backward(p), true, true);
  if (!run_instance(c.family, c.width, p)) throw_not_built(p, "backward", cc);
}

bool device_available() noexcept {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

}  // namespace flashattn::cuda
