#pragma once
// What one tile of the sm90 backward covers: a block of keys of one KV head (or of a chunk of its
// query heads, under GQA) and the steps it walks, one (query head, query block) each, query
// blocks innermost. The CTAs are persistent and claim tiles in a fixed order; every role of a CTA
// computes the tile from the index its producer claimed, so the producer, the dQ writer and the
// consumers agree on the steps.
#include <cute/config.hpp>
#include <cutlass/arch/barrier.h>

#include "cuda/common/mask_tiles.cuh"
#include "cuda/common/sequence_rows.cuh"
#include "cuda/sm90/backward_claim_order.hpp"
#include "cuda/sm90/backward_params.cuh"

namespace flashattn::cuda::sm90 {

// Named barriers of the backward (hardware ids above those CUTLASS reserves).
enum BackwardBarrier : uint32_t {
  kBarrierDsWritten = 0,  // both consumer warpgroups have written their part of dS
  kBarrierDqFull0 = 1,    // consumer warpgroup w has staged its dQ: kBarrierDqFull0 + w
  kBarrierDqEmpty0 = 3,   // the dQ writer has read warpgroup w's staging: kBarrierDqEmpty0 + w
  // dQ over each warpgroup's own keys (BackwardTraits::kDqOverOwnKeys): warpgroup w has written
  // its dS (kBarrierOwnDsWritten0 + w); warpgroup 0 has stored its partial dQ, which warpgroup 1
  // adds to and then signals kBarrierDqFull0 (the staging is emptied through kBarrierDqEmpty0).
  kBarrierOwnDsWritten0 = 5,
  kBarrierDqStaged = 7,
  // Head dim split: warpgroup w has staged half of its dQ in dO stage k (dq_staged_barrier, ids
  // 1-4); deterministic mode also: the turn of the step's dQ block is taken, for warpgroup w
  // (kBarrierDqTurnTaken0 + w, backward_producer.cuh). The keys-split kernels' ids that these share
  // are unused at these head dims.
  kBarrierDqTurnTaken0 = kBarrierOwnDsWritten0,
};

// cutlass::arch::NamedBarrier adds the 8 ids CUTLASS reserves to ours (kBarrierDqStaged the
// largest), and the hardware has 16.
static_assert(kBarrierDqStaged < 16 - cutlass::arch::NamedBarrier::ReservedNamedBarrierCount);

// Deterministic mode at 192 and 256: the threads of kBarrierDqTurnTaken0 + w (consumer warpgroup w
// and the producer's warp 2, the turn taker), and of the staging barriers (consumer warpgroup w,
// warp 1, which adds the staged half and passes the turn, and warp 2).
constexpr int kTurnTakenThreads = 128 + 32;
constexpr int kOrderedStagedThreads = 128 + 64;

// Head dim split: the barrier on which warpgroup w signals the dQ half it staged in dO stage
// `stage` (of two), ids 1-4 (deterministic mode at 192, which stages none: that its reductions are
// issued). One per stage and warpgroup: a warpgroup runs up to a step ahead of the dQ writer (its
// next step's dO is in the other stage), so with one barrier per warpgroup its arrival for step
// s + 2 could count toward step s + 1 if the writer had not yet re-armed the barrier after
// releasing step s's stage; here it goes to step s's barrier, which the writer took before that
// release (in deterministic mode the turns order the steps as well).
CUTE_HOST_DEVICE constexpr uint32_t dq_staged_barrier(int stage, int w) { return kBarrierDqFull0 + 2 * stage + w; }
static_assert(dq_staged_barrier(1, 1) < kBarrierOwnDsWritten0, "within the ids the head-dim-split default kernels leave free");
static_assert(kBarrierDqTurnTaken0 + 1 <= kBarrierDqStaged, "within the ids the keys-split kernels leave free");

struct BackwardTile {
  int n_block, kv_head, split, batch;  // split: the chunk of the KV head's query heads
  SequenceRows seq;
  int key0, valid_keys;  // first key; keys of the block inside the sequence (<= 0: none)
  int head_first;        // first query head of this CTA's chunk
  int m_first, m_count;  // the query blocks that see the keys
  int steps;             // m_count per query head of the chunk

  struct Step {
    int head, m_block;
  };
  CUTE_DEVICE Step step(int s) const { return {head_first + s / m_count, m_first + s % m_count}; }
};

// Tile `index` of the CTAs' order (backward_claim_order.hpp).
template <class Traits>
CUTE_DEVICE BackwardTile backward_tile(BackwardParams<Traits> const& p, int index) {
  BackwardTile t;
  const int columns = p.heads_kv * p.head_splits;
  const BackwardTilePosition position =
      BackwardClaimOrder{p.n_blocks, p.num_tiles / p.n_blocks, p.claim_interleave, p.claim_last_to_first}.at(index);
  t.n_block = position.n_block;
  const int column = position.column % columns;
  t.kv_head = column / p.head_splits;
  t.split = column % p.head_splits;
  t.batch = position.column / columns;
  const int split = t.split;
  t.seq = sequence_rows(t.batch, p.seqlen_q, p.seqlen_k, p.cu_seqlens_q, p.cu_seqlens_k);
  t.key0 = t.n_block * Traits::kBlockN;
  t.valid_keys = t.seq.len_k - t.key0;
  const int group = p.heads_q / p.heads_kv, heads_per_split = group / p.head_splits;
  t.head_first = t.kv_head * group + split * heads_per_split;
  t.m_first = t.m_count = t.steps = 0;
  if (t.valid_keys <= 0) return t;
  const QueryRows rows = rows_seeing_keys(t.seq.len_q, t.seq.len_k, p.window_left, p.window_right, t.key0,
                                          min(t.key0 + Traits::kBlockN, t.seq.len_k));
  if (rows.empty()) return t;
  t.m_first = rows.begin / Traits::kBlockM;
  t.m_count = (rows.end + Traits::kBlockM - 1) / Traits::kBlockM - t.m_first;
  t.steps = t.m_count * heads_per_split;
  return t;
}

// The mask of query block m_block's rows (those inside the sequence).
CUTE_DEVICE BlockMask query_block_mask(BackwardTile const& t, int window_left, int window_right, int m_block,
                                       int block_m) {
  const int row0 = m_block * block_m;
  return {t.seq.len_q, t.seq.len_k, window_left, window_right, row0, min(row0 + block_m, t.seq.len_q) - 1};
}

}  // namespace flashattn::cuda::sm90
