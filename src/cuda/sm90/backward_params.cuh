#pragma once
// Kernel parameters of the sm90 backward, passed by value as a __grid_constant__ (the TMA
// descriptors must live in parameter memory), and the layout of its fp32 dQ accumulator.
#include <cstdint>

#include "common/alibi.hpp"

#include "common/host_device.hpp"
#include "common/problem.hpp"

namespace flashattn::cuda::sm90 {

// The fp32 dQ accumulator: per query head, blocks of kBlockM query rows, each block one
// contiguous kBlockM x head dim chunk (per column slice, the fragment order of the warpgroup that
// computes it: backward_traits.cuh), so that a CTA adds a step's dQ with one bulk reduce-add per
// staging buffer.
// Sequence b's query blocks start at block dense_q(b) / kBlockM + b, which never overlaps the
// previous sequence's blocks (that sequence ends at dense_q(b), so its last block is at most
// dense_q(b) / kBlockM + b - 1).
struct DqAccumulatorLayout {
  int block_m = 0, head_dim = 0;
  std::int64_t blocks_per_head = 0;  // dense_rows_q / block_m + batch + 1

  FA_HOST_DEVICE std::int64_t first_block(int b, std::int64_t dense_q) const { return dense_q / block_m + b; }
  FA_HOST_DEVICE std::int64_t block_offset(int head, std::int64_t block) const {
    return (std::int64_t(head) * blocks_per_head + block) * block_m * head_dim;
  }
  FA_HOST_DEVICE std::int64_t elements(int heads_q) const {
    return std::int64_t(heads_q) * blocks_per_head * block_m * head_dim;
  }
};

template <class Traits>
struct BackwardParams {
  typename Traits::TmaLoadQ tma_q;
  typename Traits::TmaLoadQ tma_dout;
  typename Traits::TmaLoadK tma_k;
  typename Traits::TmaLoadV tma_v;
  typename Traits::TmaLoadStats tma_lse;
  typename Traits::TmaLoadStats tma_delta;
  // Extents the TMA tensors were built with: (rows, head dim, heads, batch) and (rows, heads).
  typename Traits::GmemShape shape_q, shape_k;
  typename Traits::StatsShape shape_stats;

  detail::SeqTensor dk, dv;
  const std::int32_t* cu_seqlens_q;  // null: fixed length
  const std::int32_t* cu_seqlens_k;
  int seqlen_q, seqlen_k;  // fixed length: every sequence's; varlen: the maxima
  int heads_q, heads_kv;
  int window_left, window_right;
  float scale;               // softmax scale, applied to dK here and to dQ on conversion
  float scale_log2;          // scale * log2(e) (no softcap)
  float softcap_inner;       // softcap only: scale / softcap
  float softcap_outer_log2;  // softcap only: softcap * log2(e)
  bool softcap;
  detail::DropoutParams dropout;  // read by the kernel instantiated with kDropout
  detail::AlibiSlopes alibi;  // null data: no ALiBi (common/alibi.hpp)

  // The query heads of one KV head are split into head_splits chunks, one tile each; with more
  // than one, each tile writes fp32 partial dK/dV [split][dense_rows_k][heads_kv][head_dim].
  int head_splits;
  int n_blocks;   // key blocks per sequence (of the longest, for variable length)
  int num_tiles;  // n_blocks * heads_kv * head_splits * batch
  // Tiles handed out so far beyond each CTA's first (zero at launch): a CTA's producer claims the
  // next one in the tile order as soon as it has issued its current tile's loads.
  int* tile_counter;
  float* dk_partial;
  float* dv_partial;
  std::int64_t dense_rows_k;

  float* dq_accum;
  DqAccumulatorLayout dq_layout;
  // Deterministic mode: per (query head, dQ block) the number of CTAs that have added their
  // share, so that they add in key-block order; null otherwise.
  int* dq_semaphore;
  // The claim order (backward_claim_order.hpp): columns taking turns, and deterministic mode's
  // key blocks last to first.
  int claim_interleave;
  bool claim_last_to_first;
  // Development timeline (trace.cuh): written only by FLASHATTN_SM90_TRACE builds.
  std::uint64_t* trace;
};

}  // namespace flashattn::cuda::sm90
