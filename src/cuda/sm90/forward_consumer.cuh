#pragma once
// The consumer warpgroups of the sm90 forward: per tile, S = Q K^T (both operands in shared
// memory), the online softmax in registers, O += P V (P from registers), then the epilogue.
//
// Two overlaps hide the softmax under tensor-core work:
//  - intra-warpgroup: QK^T of key block j - 1 is issued before the softmax of block j is
//    finished with (blocks run last to first), and the rescale of O runs while it computes;
//  - ping-pong between the warpgroups (two, or three at d <= 64): each issues its GEMMs only
//    in its turn (named barriers), so the others' softmax runs while its GEMMs occupy the
//    tensor cores.
// A warpgroup whose 64 rows all lie past the end of the sequence (in a sequence's last tile)
// computes nothing: it only keeps step with the pipelines and the turns, and leaves the SM to
// the warpgroups that have rows.
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "cuda/common/device_math.cuh"
#include "cuda/common/fragment.cuh"
#include "cuda/common/mask.cuh"
#include "cuda/sm90/forward_epilogue.cuh"
#include "cuda/sm90/forward_params.cuh"
#include "cuda/sm90/forward_tile.cuh"
#include "cuda/sm90/forward_trace.cuh"
#include "cuda/sm90/gmma_fragment.cuh"

namespace flashattn::cuda::sm90 {

// Turn-taking of the consumer warpgroups around their GEMM issue, round robin: warpgroup w
// waits on its barrier, which warpgroup w - 1 opens when its turn ends.
template <int kWarpGroups>
struct PingPong {
  int warp_group;  // 0 .. kWarpGroups - 1
  static constexpr int kThreads = 2 * 128;  // the waiting warpgroup and the one passing on

  // The first warpgroup goes first: the last opens its barrier once.
  CUTE_DEVICE void start() const {
    if (warp_group == kWarpGroups - 1) cutlass::arch::NamedBarrier::arrive(kThreads, kBarrierWarpGroup0);
  }
  CUTE_DEVICE void wait_turn() const {
    cutlass::arch::NamedBarrier::sync(kThreads, kBarrierWarpGroup0 + warp_group);
  }
  CUTE_DEVICE void pass_turn() const {
    cutlass::arch::NamedBarrier::arrive(kThreads, kBarrierWarpGroup0 + (warp_group + 1) % kWarpGroups);
  }
};

template <class Traits, class Softmax>
CUTE_DEVICE void run_consumers(ForwardParams<Traits> const& p, typename Traits::SharedStorage& smem,
                               typename Traits::PipelineQ& pipeline_q,
                               typename Traits::PipelineK& pipeline_k,
                               typename Traits::PipelineV& pipeline_v,
                               typename Traits::PipelineTile& pipeline_tile, int thread, int warp_group) {
  using namespace cute;
  using Element = typename Traits::Element;
  constexpr int kBlockN = Traits::kBlockN;

  typename Traits::TiledMmaQK mma_qk;
  typename Traits::TiledMmaPV mma_pv;
  auto thread_qk = mma_qk.get_thread_slice(thread);
  auto thread_pv = mma_pv.get_thread_slice(thread);

  Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Traits::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Traits::SmemLayoutK{});
  Tensor sVt = make_tensor(make_smem_ptr(smem.v.data()), typename Traits::SmemLayoutVt{});
  Tensor tSrQ = thread_qk.partition_fragment_A(sQ);   // descriptors (.., stage)
  Tensor tSrK = thread_qk.partition_fragment_B(sK);   // (.., stage)
  Tensor tOrV = thread_pv.partition_fragment_B(sVt);  // (.., stage)

  Tensor tSrS = partition_fragment_C(mma_qk, select<0, 1>(typename Traits::TileShapeQK{}));
  Tensor tOrO = partition_fragment_C(mma_pv, select<0, 1>(typename Traits::TileShapePV{}));
  Tensor tOrP = make_tensor<Element>(gmma_accumulator_as_a_layout(tSrS.layout()));
  Tensor scores = gmma_rowcol(tSrS);
  Tensor out = gmma_rowcol(tOrO);
  // (row, key) of every score and (row, dim) of every output element within the tile.
  Tensor score_coords = gmma_rowcol(thread_qk.partition_C(make_identity_tensor(select<0, 1>(typename Traits::TileShapeQK{}))));
  Tensor out_coords = gmma_rowcol(thread_pv.partition_C(make_identity_tensor(select<0, 1>(typename Traits::TileShapePV{}))));
  constexpr int kRows = decltype(size<0>(scores))::value;

  auto state_q = typename Traits::PipelineQ::PipelineState{};
  auto state_k = typename Traits::PipelineK::PipelineState{};
  auto state_v = typename Traits::PipelineV::PipelineState{};
  const PingPong<Traits::kConsumerWarpGroups> turns{warp_group};
  turns.start();
  Softmax softmax(p.scale_log2);
  const int num_tiles = p.scheduler.num_tiles();

  typename Traits::PipelineTile::PipelineState state_tile;
  Tracer trace(p.trace);

  for (;;) {
    pipeline_tile.consumer_wait(state_tile);
    TileSlot const& slot = smem.tile_slot[state_tile.index()];
    if (slot.index >= num_tiles) break;
    // The slot is held until the tile's epilogue has read the plan. The producer refills it two
    // tiles on and may wait for it, but nothing of this tile waits for the producer's next
    // publication, so holding it cannot deadlock.
    auto next_tile = [&]() {
      pipeline_tile.consumer_release(state_tile);
      ++state_tile;
    };
    trace(TraceEvent::tile);
    // What the mainloop needs of the plan, read into registers once.
    KeyTileRange blocks;
    bool idle;  // no row of this warpgroup lies in the sequence
    int unmasked_begin, unmasked_end;  // keys that every row of the tile sees
    detail::KeyRange row_keys[kRows];
    {
      TileWork const& w = slot.work;
      if (w.rows <= 0) {
        next_tile();
        continue;
      }
      if (w.key_blocks.empty()) {
        ForwardEpilogue<Traits>::store_empty(p, w, thread);
        next_tile();
        continue;
      }
      blocks = w.key_blocks;
      idle = warp_group * Traits::kRowsPerWarpGroup >= w.rows;
      unmasked_begin = w.mask.row_keys(w.mask.last_row).begin;
      unmasked_end = w.mask.row_keys(w.mask.first_row).end;
#pragma unroll
      for (int r = 0; r < kRows; ++r) row_keys[r] = w.mask.row_keys(w.row0 + get<0>(score_coords(r, 0)));
    }
    trace(TraceEvent::planned);

    // Raw q.k -> logits, then the mask where some row of the tile does not see every key of
    // the block.
    auto to_logits = [&](int block) {
      if (p.transform == ScoreTransform::softcap) {
#pragma unroll
        for (int i = 0; i < size(tSrS); ++i) tSrS(i) = accurate_tanh(tSrS(i) * p.softcap_input);
      } else if (p.transform == ScoreTransform::negate) {
#pragma unroll
        for (int i = 0; i < size(tSrS); ++i) tSrS(i) = -tSrS(i);
      }
      const int key0 = block * kBlockN;
      if (key0 < unmasked_begin || key0 + kBlockN > unmasked_end)
        mask_scores(scores, [&](int r, int c) { return key0 + get<1>(score_coords(r, c)); }, row_keys);
    };
    // P in the dtype of V, same registers order as S (tOrP only views them as an A operand).
    auto to_probabilities = [&]() {
      constexpr int kSize = decltype(size(tSrS))::value;
      cutlass::NumericArrayConverter<Element, float, kSize> convert;
      *reinterpret_cast<cutlass::Array<Element, kSize>*>(tOrP.data()) =
          convert(*reinterpret_cast<cutlass::Array<float, kSize> const*>(tSrS.data()));
    };

    softmax.reset();
    clear(tOrO);
    pipeline_q.consumer_wait(state_q);
    Tensor tSrQ_tile = tSrQ(_, _, _, state_q.index());

    if (idle) {
      // The same pipeline waits and releases, and the same turns, as the mainloop below, in
      // its order, without the GEMMs and the softmax.
      pipeline_k.consumer_wait(state_k);
      turns.wait_turn();
      turns.pass_turn();
      pipeline_k.consumer_release(state_k);
      ++state_k;
      for (int block = blocks.end - 2; block >= blocks.begin; --block) {
        pipeline_k.consumer_wait(state_k);
        turns.wait_turn();
        pipeline_v.consumer_wait(state_v);
        turns.pass_turn();
        pipeline_k.consumer_release(state_k);
        ++state_k;
        pipeline_v.consumer_release(state_v);
        ++state_v;
      }
      if constexpr (!Traits::kOutputInQueryTile) pipeline_q.consumer_release(state_q);
      pipeline_v.consumer_wait(state_v);
      turns.wait_turn();
      turns.pass_turn();
      pipeline_v.consumer_release(state_v);
      ++state_v;
    } else {
      // Last key block: S only.
      int block = blocks.end - 1;
      pipeline_k.consumer_wait(state_k);
      trace(TraceEvent::operands);
      turns.wait_turn();
      trace(TraceEvent::turn);
      warpgroup_gemm<true>(mma_qk, tSrQ_tile, tSrK(_, _, _, state_k.index()), tSrS);
      turns.pass_turn();
      warpgroup_wait<0>();
      trace(TraceEvent::s_done);
      pipeline_k.consumer_release(state_k);
      ++state_k;
      to_logits(block);
      auto correction = softmax.template step<true>(scores);
      to_probabilities();
      trace(TraceEvent::softmax);

      // Middle blocks: S of block j - 1 computes while O is rescaled for, and then accumulates,
      // P_j V_j.
      for (--block; block >= blocks.begin; --block) {
        pipeline_k.consumer_wait(state_k);
        turns.wait_turn();
        trace(TraceEvent::turn);
        warpgroup_gemm<true>(mma_qk, tSrQ_tile, tSrK(_, _, _, state_k.index()), tSrS);
        Softmax::rescale(out, correction);
        pipeline_v.consumer_wait(state_v);
        warpgroup_gemm<false>(mma_pv, tOrP, tOrV(_, _, _, state_v.index()), tOrO);
        turns.pass_turn();
        warpgroup_wait<1>();  // S done; P.V may still run
        trace(TraceEvent::s_done);
        pipeline_k.consumer_release(state_k);
        ++state_k;
        to_logits(block);
        correction = softmax.template step<false>(scores);
        trace(TraceEvent::softmax);
        warpgroup_wait<0>();  // P.V done: its P registers may be overwritten
        trace(TraceEvent::pv_done);
        pipeline_v.consumer_release(state_v);
        ++state_v;
        to_probabilities();
      }
      if constexpr (!Traits::kOutputInQueryTile)  // every QK^T of the tile is complete
        pipeline_q.consumer_release(state_q);

      // First key block: P.V only.
      Softmax::rescale(out, correction);
      pipeline_v.consumer_wait(state_v);
      turns.wait_turn();
      trace(TraceEvent::turn);
      warpgroup_gemm<false>(mma_pv, tOrP, tOrV(_, _, _, state_v.index()), tOrO);
      turns.pass_turn();
      warpgroup_wait<0>();
      trace(TraceEvent::pv_done);
      pipeline_v.consumer_release(state_v);
      ++state_v;
    }

    // The epilogue runs for an idle warpgroup too (at d > 128 it holds a barrier of all consumer
    // warpgroups); it stores none of that warpgroup's rows.
    float lse[kRows];
    if (idle) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) lse[r] = -INFINITY;
    } else {
      softmax.finalize(out, p.logit_scale, lse);
    }
    trace(TraceEvent::finalized);
    ForwardEpilogue<Traits>::store(p, smem, slot.work, tOrO, out_coords, lse, thread);
    trace(TraceEvent::stored);
    if constexpr (Traits::kOutputInQueryTile)  // the store has read the output tile
      pipeline_q.consumer_release(state_q);
    ++state_q;
    next_tile();
  }
  if (thread % 128 == 0) tma_store_wait<0>();  // shared memory must outlive the last store
}

}  // namespace flashattn::cuda::sm90
