#pragma once
// CPU part of a KV-cache call before the attention: new rows written into the cache (rotated),
// and a rotated copy of the queries.
#include "common/kv_append.hpp"
#include "common/problem.hpp"

namespace flashattn::cpu {

// Writes k_new (rotated when a.rotates()) and v_new at rows cache_seqlens[b] + i of the cache
// that p.k / p.v address (through p.kv: pages, cache_batch_idx).
void append_kv(const detail::ForwardProblem& p, const detail::KvAppend& a);

// dst (contiguous (batch, seqlen_q, heads_q, head_dim), p.dtype) = p.q rotated at the query
// positions.
void rotate_queries(const detail::ForwardProblem& p, const detail::KvAppend& a, void* dst);

}  // namespace flashattn::cpu
