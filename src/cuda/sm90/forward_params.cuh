#pragma once
// Kernel parameters of the sm90 forward, passed by value as a __grid_constant__ (the TMA
// descriptors must live in parameter memory).
#include <cstdint>

#include "common/philox.hpp"
#include "common/alibi.hpp"
#include "common/kv_layout.hpp"
#include "cuda/common/tile_order.cuh"
#include "cuda/sm90/forward_tail_split.cuh"
#include "cuda/sm90/page_box_maps.cuh"

namespace flashattn::cuda::sm90 {

// How raw q.k products become logits (the units the running max is taken in).
enum class ScoreTransform : int {
  none,     // logit = q.k (scale > 0: folded into scale_log2)
  negate,   // logit = -q.k (scale < 0)
  softcap,  // logit = tanh(q.k * softcap_input); score = softcap * logit
};

template <class Traits>
struct ForwardParams {
  typename Traits::TmaLoadQ tma_q;
  typename Traits::TmaLoadK tma_k;
  typename Traits::TmaLoadV tma_v;
  typename Traits::TmaStoreO tma_o;
  // (rows, head dim, heads, batch) extents the TMA tensors were built with; FP8 V^T's from the
  // pre-pass is (head dim, keys, heads, batch).
  typename Traits::GmemShape shape_q, shape_k, shape_v, shape_o;
  // Paged K/V (kv.paged(); forward_paged_kv.cuh): boxes of Traits::kPageRows keys of K over the
  // page pool, (row in page, head dim, heads_kv, page); tma_k and tma_v, built over the pools too,
  // copy whole blocks where pages hold them. V's other blocks are copied in rows from v (element
  // (page, row, h) at v + page * v_page_stride + row * v_row_stride + h * v_head_stride).
  typename Traits::TmaLoadKPage tma_k_page;
  typename Traits::GmemShape shape_kv_page;
  detail::KvMap kv;  // per-sequence key ranges and pages (common/kv_layout.hpp); empty: none
  const void* v;
  std::int64_t v_page_stride, v_row_stride, v_head_stride;
  // Where the pools allow it (page_maps.coords.usable): a page (or a whole block) of K or V in one
  // 5-D box (page_box_maps.cuh), and the first value_box_pages pages of V's blocks so.
  PageBoxMaps page_maps;
  int value_box_pages;

  // Output, also written directly (variable length, empty tiles): element (row, h) of
  // sequence b at out + b * batch_stride + row * seq_stride + h * head_stride.
  void* out;
  std::int64_t out_batch_stride, out_seq_stride, out_head_stride;
  int head_dim;  // the problem's (a multiple of 8, at most kHeadDim): columns past it are not stored
  float* lse;  // null: not requested
  std::int64_t lse_batch_stride, lse_head_stride;

  const std::int32_t* cu_seqlens_q;  // null: fixed length
  const std::int32_t* cu_seqlens_k;
  int seqlen_q, seqlen_k;  // fixed length: every sequence's; varlen: unused
  int group;               // query heads per KV head
  int window_left, window_right;
  int heads_q;
  detail::DropoutParams dropout;  // read by the kernel instantiated with kDropout

  ScoreTransform transform;
  float softcap_input;  // softcap only: tanh argument per unit of q.k
  float scale_log2;     // logit -> log2 units
  float logit_scale;    // logit -> natural-log units (for the LSE)
  // ALiBi (common/alibi.hpp), null data: off. Added to the logits times alibi_to_logit
  // (1 / logit_scale).
  detail::AlibiSlopes alibi;
  float alibi_to_logit;
  // FP8: Q's and K's descale factors fold into each tile's score scale, V's into its output.
  detail::Descale q_descale, k_descale, v_descale;

  TileOrder order;
  // The last partial wave dealt out as units of key blocks (forward_tail_split.cuh); inactive:
  // every work item is a tile. partials: 2 slots per unit; tail_arrivals: per tail tile and
  // consumer warpgroup, zero at launch.
  TailSplit tail;
  float2* partials;
  int* tail_arrivals;
  // Work items handed out so far beyond each CTA's first (zero at launch): CTAs take the next
  // one in this order when they are about to run out of work.
  int* tile_counter;
  // Development timeline (trace.cuh): written only by FLASHATTN_SM90_TRACE builds.
  std::uint64_t* trace;
};

}  // namespace flashattn::cuda::sm90
