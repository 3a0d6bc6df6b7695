#pragma once
// Validation of KV-cache calls and paged K/V (src/api/kv_cache.cpp).
#include "common/kv_append.hpp"
#include "common/problem.hpp"
#include "flashattn/attention.hpp"
#include "flashattn/kv_cache.hpp"

namespace flashattn::detail {

// ForwardArgs with block_table or seqused_k: the problem with problem.kv filled.
ForwardProblem make_paged_forward_problem(const ForwardArgs& args);

// A validated KV-cache call: the attention over the cache and the append + rotary before it.
struct KvCachePlan {
  ForwardProblem problem;
  KvAppend append;
};
KvCachePlan make_kvcache_plan(const KvCacheArgs& args);

// Runs a CPU plan: append, rotate the queries into a buffer, attend (fast path or reference).
void run_kvcache_cpu(KvCachePlan& plan, bool reference);

}  // namespace flashattn::detail
