#pragma once
// Development timelines of the sm90 forward and backward, compiled in only with
// FLASHATTN_SM90_TRACE: one thread of each consumer warpgroup records (event, SM clock) where a
// tile starts and where each phase of its steps (forward: GEMM turns, softmax, epilogue; backward:
// the steps' GEMMs and hand-offs, the epilogue) ends. The launch copies the last call's records to
// the file FLASHATTN_SM90_TRACE_FILE (forward) or FLASHATTN_SM90_BACKWARD_TRACE_FILE (backward)
// names; bench/probes/sm90_trace.py reads it.
// Each warpgroup keeps its first kTraceRecords records. Without the macro a Tracer is empty and
// every record compiles to nothing. Records perturb what they observe: in a traced build ptxas
// keeps the P.V wait after the softmax (it hoists it above otherwise) and spills more outside
// the mainloop, so phases are those of the traced code (docs/log/sm90-forward.md, 2026-11-23:
// where the cycles go).
#include <cute/config.hpp>

#include <cstdint>
#ifdef FLASHATTN_SM90_TRACE
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda/common/check.cuh"
#endif

namespace flashattn::cuda::sm90 {

enum class TraceEvent : std::uint64_t {
  none = 0,   // an unused record
  tile,       // the tile's index arrived
  planned,    // the tile's mask and key range computed
  operands,   // Q and the first K of the tile are in shared memory
  turn,       // the warpgroup's GEMM turn began (wait_turn returned)
  s_done,     // S = Q K^T of the block complete
  softmax,    // the block's softmax step done (P ready for the first block)
  pv_done,    // O += P V of the block complete
  finalized,  // O normalized, LSE computed
  stored,     // the epilogue issued the tile's store (backward: dK and dV)
  // The backward (a tile records `tile` once set up, `operands` once K and V are in shared memory, `stored`).
  step,       // a step began (before waiting for its Q)
  scores,     // P^T and dS^T computed in registers
  ds_shared,  // both warpgroups' dS in shared memory (the step's named barrier passed)
  step_done,  // dK of the step complete, its stages released
};

// Records per (CTA, warpgroup), warpgroup = threadIdx.x / 128: 0 is the producer (records
// nothing), 1.. the consumers.
constexpr int kTraceWarpGroups = 4;
constexpr int kTraceRecords = 4096;

#ifdef FLASHATTN_SM90_TRACE
// Holds only a count: the buffer is read from the kernel parameters and the slot recomputed at
// each record, so that tracing takes one register from the kernel it observes.
struct Tracer {
  std::uint64_t* const& buffer;  // the kernel parameter
  int count = 0;

  CUTE_DEVICE Tracer(std::uint64_t* const& buffer_param) : buffer(buffer_param) {}
  // Thread 0 of each warpgroup records: the event in the top 8 bits, the SM's clock below.
  CUTE_DEVICE void operator()(TraceEvent event) {
    if (buffer == nullptr || threadIdx.x % 128 != 0 || count >= kTraceRecords) return;
    const std::int64_t slot = std::int64_t(blockIdx.x) * kTraceWarpGroups + threadIdx.x / 128;
    buffer[slot * kTraceRecords + count++] =
        (std::uint64_t(event) << 56) | (std::uint64_t(clock64()) & ((1ull << 56) - 1));
  }
};

// Host: the call's timeline to the file the environment variable `variable` names, overwritten by
// every call (synchronizes the stream).
inline void write_trace(const char* variable, const std::uint64_t* trace, size_t count, cudaStream_t stream) {
  const char* path = std::getenv(variable);
  if (path == nullptr) return;
  std::vector<std::uint64_t> host(count);
  FA_CUDA_CHECK(cudaMemcpyAsync(host.data(), trace, count * sizeof(std::uint64_t), cudaMemcpyDeviceToHost, stream));
  FA_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (std::FILE* f = std::fopen(path, "wb")) {
    std::fwrite(host.data(), sizeof(std::uint64_t), count, f);
    std::fclose(f);
  }
}
#else
struct Tracer {
  CUTE_DEVICE Tracer(std::uint64_t* const&) {}
  CUTE_DEVICE void operator()(TraceEvent) const {}
};
#endif

}  // namespace flashattn::cuda::sm90
