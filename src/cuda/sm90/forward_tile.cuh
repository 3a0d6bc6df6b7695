#pragma once
// What one tile of the sm90 forward covers: the tile order's (query block, head, batch), the
// sequence's rows, and the key blocks its rows see. The producer computes it from the tile
// index and passes it on to the consumers with the index.
#include <cute/config.hpp>

#include "cuda/common/mask.cuh"
#include "cuda/common/tile_order.cuh"
#include "cuda/sm90/forward_params.cuh"

namespace flashattn::cuda::sm90 {

// Named barriers (hardware ids above those CUTLASS reserves).
enum ForwardBarrier : uint32_t {
  kBarrierWarpGroup0 = 1,          // turns: consumer warpgroup w waits on kBarrierWarpGroup0 + w
  kBarrierEpilogueWarpGroup0 = 4,  // warpgroup w around its part of the output tile
  // Above head dim 128, where the output is staged in the tile's last K and V stages: warpgroup
  // 1 is done reading the last K stage (warpgroup 0's output goes there), warpgroup 0 the last
  // V stage (warpgroup 1's).
  kBarrierLastKeyStageRead = 0,
  kBarrierLastValueStageRead = 7,
};

// Where sequence b lives: its lengths and, for variable length, its first row in the packed
// tensors (0 for fixed length, where the batch index addresses it). With paged K/V, row_k is 0
// and len_k what kv_span (common/kv_layout.hpp) gives: seqused_k and appended rows included.
struct SequenceRows {
  int len_q, len_k;
  int row_q, row_k;
};

template <class Traits>
CUTE_DEVICE SequenceRows sequence_rows(ForwardParams<Traits> const& p, int b) {
  SequenceRows s{p.seqlen_q, p.seqlen_k, 0, 0};
  if (p.cu_seqlens_q != nullptr) {
    const int q0 = p.cu_seqlens_q[b], k0 = p.cu_seqlens_k[b];
    s = {p.cu_seqlens_q[b + 1] - q0, p.cu_seqlens_k[b + 1] - k0, q0, k0};
  }
  if (p.kv.any()) {  // the launch passes kv only where api.hpp's supports_kv holds (no k_start or batch_index)
    const detail::KvSpan span = detail::kv_span(p.kv, b, s.len_k, s.row_k);
    s.len_k = span.len_k;
    s.row_k = int(span.offset_k);
  }
  return s;
}

struct TileWork {
  TileCoord coord;
  SequenceRows seq;
  int row0;               // first query row of the tile within its sequence
  int rows;               // query rows of the tile inside the sequence (<= 0: none)
  KeyTileRange key_blocks;  // key blocks to visit, last to first; empty: the rows see no key
  int segment_slot;         // a segment of a split tile: its partial's slot (forward_tail_split.cuh); else -1
};

// The mask of the tile's rows (valid when rows > 0). Rebuilt where needed rather than carried
// in TileWork: the plan is smaller to hand over, and the producer, which writes it with 24
// registers at head dim 256, then holds it without spilling.
template <class Traits>
CUTE_DEVICE BlockMask tile_mask(ForwardParams<Traits> const& p, TileWork const& w) {
  return {w.seq.len_q, w.seq.len_k, p.window_left, p.window_right, w.row0, w.row0 + w.rows - 1};
}

// How the producer hands a tile to the consumers (a slot of shared memory per stage of the
// tile pipeline): its work item's index (num_items or more: no work left) and its plan. The
// producer plans every tile for its loads anyway; the consumers read the plan instead of
// redoing its integer divisions at the start of the tile and again in its epilogue, both on the
// critical path at every tile boundary (docs/log/sm90-forward.md, 2026-11-23: the tile's plan
// handed over). A consumer holds the slot until its
// epilogue is done.
struct TileSlot {
  int index;
  TileWork work;
};

template <class Traits>
CUTE_DEVICE TileWork plan_tile(ForwardParams<Traits> const& p, int index) {
  TileWork w;
  w.coord = p.order.tile(index);
  w.seq = sequence_rows(p, w.coord.batch);
  w.row0 = w.coord.m_block * Traits::kBlockM;
  w.rows = min(Traits::kBlockM, w.seq.len_q - w.row0);
  w.key_blocks = {};
  if (w.rows > 0) w.key_blocks = tile_mask(p, w).tiles(Traits::kBlockN);
  w.segment_slot = -1;
  return w;
}

// The work items the producer publishes (index and plan, one tile slot each), as the producer
// warpgroup's other three warps follow them (paged V's loader, FP8 V's transposer): read from the
// slots as the consumers read them, f(plan) for each, until the end marker (an index of num_items
// or more).
template <class PipelineTile, class SharedStorage, class F>
CUTE_DEVICE void for_each_published_item(PipelineTile& pipeline_tile, SharedStorage const& smem, int num_items, F&& f) {
  typename PipelineTile::PipelineState state;
  for (;;) {
    pipeline_tile.consumer_wait(state);
    const int index = smem.tile_slot[state.index()].index;
    const TileWork w = smem.tile_slot[state.index()].work;
    pipeline_tile.consumer_release(state);
    ++state;
    if (index >= num_items) break;
    f(w);
  }
}

// Work item `index`'s segment s (0, or 1 for a tail unit that runs across a tile boundary):
// a whole tile, or part of a tail tile's key blocks.
template <class Traits>
CUTE_DEVICE TileWork plan_work(ForwardParams<Traits> const& p, int index, int s) {
  TailSplit const& tail = p.tail;
  if (!Traits::kTailSplit || index < tail.first_tile) return plan_tile(p, index);
  const int u = index - tail.first_tile;
  TileWork w = plan_tile(p, tail.first_tile + tail.segment_tile(u, s));
  int begin, end;
  tail.segment_blocks(u, s, begin, end);
  w.key_blocks = {w.key_blocks.begin + begin, w.key_blocks.begin + end};
  w.segment_slot = TailSplit::slot(u, s);
  return w;
}

// How many segments work item `index` has.
template <class Traits>
CUTE_DEVICE int work_segments(ForwardParams<Traits> const& p, int index) {
  if constexpr (!Traits::kTailSplit) return 1;
  return index < p.tail.first_tile ? 1 : p.tail.segments(index - p.tail.first_tile);
}

}  // namespace flashattn::cuda::sm90
