#pragma once
// The append + rotary step of a KV-cache call on the GPU, as one small kernel before the
// attention: new K rows rotated and written into the cache, new V rows copied, and the queries
// rotated into a workspace the attention then reads. Host entry in kv_append.cu.
#include <cuda_runtime.h>

#include "common/kv_append.hpp"
#include "common/problem.hpp"

namespace flashattn::cuda {

// Enqueues the step on p.stream. q_rotated: (batch, seqlen_q, heads_q, head_dim) contiguous in
// p.dtype, or null when a.rotates() is false (the queries are then not copied).
void launch_kv_append(const detail::ForwardProblem& p, const detail::KvAppend& a, void* q_rotated);

}  // namespace flashattn::cuda
