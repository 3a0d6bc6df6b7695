#pragma once
// The consumer warpgroups of the sm90 forward: per tile, S = Q K^T (K from shared memory; Q
// from registers up to head dim 128, else from shared memory), the online softmax in registers,
// O += P V (P from registers), then the epilogue. kDropout: the keep bits of a key block are
// drawn while its S = Q K^T runs (forward_dropout.cuh), and the dropped entries of P are zeroed
// after its softmax step (the row sums and the LSE stay undropped); O is scaled by 1 / (1 - p)
// before the epilogue. FP8 (Traits::kFp8): the tile's descale factors fold into its score scale and
// its output (K's per 64-key chunk under block quantization, in the softmax step:
// fp8_key_scales.cuh), and P becomes an e4m3 operand (fp8_probabilities.cuh).
//
// Two overlaps hide the softmax under tensor-core work:
//  - intra-warpgroup: QK^T of key block j - 1 is issued before the softmax of block j is
//    finished with (blocks run last to first), and the rescale of O runs while it computes;
//  - ping-pong between the warpgroups (two, or three at d <= 64): each issues its GEMMs only
//    in its turn (named barriers), so the others' softmax runs while its GEMMs occupy the
//    tensor cores.
// FP8 at d = 65-128 on 192-row tiles (Traits::kSerialMainloop) keeps only the second: a
// warpgroup's turn issues S alone, and its P.V, issued after the softmax outside the turns, is
// complete before its next S (the registers hold no S beside P).
// Each warpgroup computes only the key blocks that its own 64 rows see, a sub-range of the
// tile's: near a causal diagonal or a window's edge a warpgroup may see fewer blocks than the
// tile's last rows (192-row tiles, or key blocks narrower than the tile), and one whose rows all
// lie past the end of the sequence sees none. For the other blocks it only keeps step with the
// pipelines and the turns, and leaves the SM to the warpgroups that compute.
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "cuda/common/device_math.cuh"
#include "cuda/common/fragment.cuh"
#include "cuda/common/alibi.cuh"
#include "cuda/common/mask.cuh"
#include "cuda/sm90/forward_dropout.cuh"
#include "cuda/sm90/fp8_key_scales.cuh"
#include "cuda/sm90/fp8_probabilities.cuh"
#include "cuda/sm90/forward_epilogue.cuh"
#include "cuda/sm90/forward_params.cuh"
#include "cuda/sm90/forward_tail_split.cuh"
#include "cuda/sm90/forward_tile.cuh"
#include "cuda/sm90/trace.cuh"
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

// The A operand of S = Q K^T for the tile whose Q is in `stage`: the registers themselves, or
// that stage's descriptors.
template <class Traits, class QueryFragment>
CUTE_DEVICE decltype(auto) query_operand(QueryFragment& q, int stage) {
  if constexpr (Traits::kQueryInRegisters)
    return (q);
  else
    return q(cute::_, cute::_, cute::_, stage);
}

template <class Traits, class Softmax, bool kDropout = false, bool kKeyBlockScales = false>
CUTE_DEVICE void run_consumers(ForwardParams<Traits> const& p, typename Traits::SharedStorage& smem,
                               typename Traits::PipelineQ& pipeline_q,
                               typename Traits::PipelineK& pipeline_k,
                               typename Traits::PipelineV& pipeline_v,
                               typename Traits::PipelineTile& pipeline_tile, int thread, int warp_group) {
  using namespace cute;
  using Element = typename Traits::Element;
  constexpr int kBlockN = Traits::kBlockN;
  static_assert(!kDropout || Traits::kConsumerWarpGroups == 2, "dropout runs on 128-row tiles (query_block_rows)");

  typename Traits::TiledMmaQK mma_qk;
  typename Traits::TiledMmaPV mma_pv;
  auto thread_qk = mma_qk.get_thread_slice(thread);
  auto thread_pv = mma_pv.get_thread_slice(thread);

  Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Traits::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Traits::SmemLayoutK{});
  Tensor sVt = make_tensor(make_smem_ptr(smem.v.data()), typename Traits::SmemLayoutVt{});
  // Q: descriptors (.., stage), or this thread's part of its warpgroup's rows in registers,
  // read from the stage by ldmatrix at the tile's start (forward_traits.cuh).
  Tensor tSrQ = [&] {
    if constexpr (Traits::kQueryInRegisters)
      return thread_qk.partition_fragment_A(sQ(_, _, 0));
    else
      return thread_qk.partition_fragment_A(sQ);
  }();
  Tensor tSrK = thread_qk.partition_fragment_B(sK);   // (.., stage)
  Tensor tOrV = thread_pv.partition_fragment_B(sVt);  // (.., stage)

  Tensor tSrS = partition_fragment_C(mma_qk, select<0, 1>(typename Traits::TileShapeQK{}));
  Tensor tOrO = partition_fragment_C(mma_pv, select<0, 1>(typename Traits::TileShapePV{}));
  Tensor tOrP = [&] {
    if constexpr (Traits::kFp8)
      return make_tensor<Element>(ProbabilityOperandLayout<kBlockN>{});
    else
      return make_tensor<Element>(gmma_accumulator_as_a_layout(tSrS.layout()));
  }();
  Tensor scores = gmma_rowcol(tSrS);
  Tensor out = gmma_rowcol(tOrO);
  // (row, key) of every score and (row, dim) of every output element within the tile.
  Tensor score_coords = gmma_rowcol(thread_qk.partition_C(make_identity_tensor(select<0, 1>(typename Traits::TileShapeQK{}))));
  Tensor out_coords = gmma_rowcol(thread_pv.partition_C(make_identity_tensor(select<0, 1>(typename Traits::TileShapePV{}))));
  constexpr int kRows = decltype(size<0>(scores))::value;
  [[maybe_unused]] Tensor drop_coords =
      gmma_as_m16n8(thread_qk.partition_C(make_identity_tensor(select<0, 1>(typename Traits::TileShapeQK{}))));

  auto state_q = typename Traits::PipelineQ::PipelineState{};
  auto state_k = typename Traits::PipelineK::PipelineState{};
  auto state_v = typename Traits::PipelineV::PipelineState{};
  static_assert(std::is_same_v<typename Traits::PipelineK::PipelineState, typename Traits::PipelineV::PipelineState>);
  typename Traits::PipelineK::PipelineState held_stage;  // above head dim 128: the stage holding the output
  const PingPong<Traits::kConsumerWarpGroups> turns{warp_group};
  turns.start();
  Softmax softmax(p.scale_log2);
  const int num_items = p.tail.num_items();

  typename Traits::PipelineTile::PipelineState state_tile;
  Tracer trace(p.trace);

  for (;;) {
    pipeline_tile.consumer_wait(state_tile);
    TileSlot const& slot = smem.tile_slot[state_tile.index()];
    if (slot.index >= num_items) break;
    // The slot is held until the tile's epilogue has read the plan. The producer refills it two
    // tiles on and may wait for it, but nothing of this tile waits for the producer's next
    // publication, so holding it cannot deadlock.
    auto next_tile = [&]() {
      pipeline_tile.consumer_release(state_tile);
      ++state_tile;
    };
    trace(TraceEvent::tile);
    // What the mainloop needs of the plan, read into registers once.
    KeyTileRange blocks;  // the tile's key blocks
    KeyTileRange mine;    // those that this warpgroup's rows see (empty: none)
    bool has_rows;        // this warpgroup has rows in the sequence
    int unmasked_begin, unmasked_end;  // keys that every row of this warpgroup sees
    detail::KeyRange row_keys[kRows];
    // Dropout's coordinates: the tile's first row, and batch * heads_q + head (the stream's
    // counter takes (b * heads_q + h); passed below as b with heads_q 1 and h 0).
    [[maybe_unused]] int tile_row0 = 0, tile_batch_head = 0;
    // FP8: Q's times K's descale factor, which scales the raw q.k (the tanh argument under softcap,
    // else the logits: logit_descale), and V's (output), for the tile's (batch, KV head). Under
    // block quantization Q's factor is the block's that holds this warpgroup's rows, and K's varies
    // along the keys: it is taken per 64-key chunk (key_factors), not into the tile's.
    [[maybe_unused]] float tile_qk_descale = 1.f, tile_logit_descale = 1.f, tile_v_descale = 1.f;
    [[maybe_unused]] int tile_batch = 0, tile_head_kv = 0, tile_last_key = 0;
    {
      TileWork const& w = slot.work;
      if constexpr (kDropout) {
        tile_row0 = w.row0;
        tile_batch_head = w.coord.batch * p.heads_q + w.coord.head;
      }
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
      if constexpr (Traits::kFp8) {
        // Q's factor is this warpgroup's: a 192-row tile spans two blocks of Q's factors.
        static_assert(kFp8ScaleBlockRows % Traits::kRowsPerWarpGroup == 0, "a warpgroup's rows lie in one block");
        const int head_kv = w.coord.head / p.group;
        tile_batch = w.coord.batch;
        tile_head_kv = head_kv;
        tile_last_key = w.seq.len_k - 1;
        tile_qk_descale = p.q_descale.at(w.coord.batch, head_kv, w.row0 + warp_group * Traits::kRowsPerWarpGroup) *
                          (p.k_descale.blocked() ? 1.f : p.k_descale.at(w.coord.batch, head_kv));
        tile_v_descale = p.v_descale.at(w.coord.batch, head_kv);
        tile_logit_descale = p.transform == ScoreTransform::softcap ? 1.f : tile_qk_descale;
        softmax.set_scale_log2(p.scale_log2 * tile_logit_descale);
      }
      const BlockMask mask = tile_mask(p, w);
      BlockMask own = mask;  // this warpgroup's rows that lie in the sequence
      own.first_row = w.row0 + warp_group * Traits::kRowsPerWarpGroup;
      own.last_row = min(own.first_row + Traits::kRowsPerWarpGroup - 1, mask.last_row);
      has_rows = own.first_row <= own.last_row;
      mine = has_rows ? own.tiles(kBlockN) : KeyTileRange{};
      mine = {max(mine.begin, blocks.begin), min(mine.end, blocks.end)};  // a segment: its blocks only
      if (mine.empty()) mine = {};
      unmasked_begin = own.row_keys(own.last_row).begin;
      unmasked_end = own.row_keys(own.first_row).end;
#pragma unroll
      for (int r = 0; r < kRows; ++r) row_keys[r] = mask.row_keys(w.row0 + get<0>(score_coords(r, 0)));
    }
    trace(TraceEvent::planned);

    // FP8 under block quantization (kKeyBlockScales, a kernel of its own so that the default one
    // keeps its code and registers): the factors of the block's 64-key chunks of K (fp8_key_scales.cuh), read
    // after S; they join the tanh's input scale under softcap (to_logits), else the softmax step
    // (softmax_step).
    static_assert(!kKeyBlockScales || Traits::kFp8, "block scales go with e4m3 inputs");
    auto key_factors = [&](auto block) {  // generic: instantiated by kKeyBlockScales kernels only
      return key_chunk_factors<kBlockN>(p.k_descale, tile_batch, tile_head_kv, block * kBlockN, tile_last_key);
    };
    // Raw q.k -> logits, ALiBi's bias (cuda/common/alibi.cuh) when given, then the mask where
    // some row of this warpgroup does not see every key of the block.
    auto to_logits = [&](int block) {
      if (p.transform == ScoreTransform::softcap) {
        if constexpr (kKeyBlockScales) {
          const auto f = key_factors(block);
#pragma unroll
          for (int r = 0; r < size<0>(scores); ++r)
#pragma unroll
            for (int c = 0; c < size<1>(scores); ++c)
              scores(r, c) =
                  accurate_tanh(scores(r, c) * (p.softcap_input * tile_qk_descale * f.chunk[c / kKeyChunkColumns]));
        } else {
#pragma unroll
          for (int i = 0; i < size(tSrS); ++i) tSrS(i) = accurate_tanh(tSrS(i) * (p.softcap_input * tile_qk_descale));
        }
      } else if (p.transform == ScoreTransform::negate) {
#pragma unroll
        for (int i = 0; i < size(tSrS); ++i) tSrS(i) = -tSrS(i);
      }
      const int key0 = block * kBlockN;
      if (p.alibi.enabled()) {  // a uniform branch per block; the plan is re-read from the slot
        TileWork const& w = slot.work;
        const float slope = p.alibi_to_logit * p.alibi.slope(w.coord.batch, w.coord.head);
        const int diag0 = w.row0 + w.seq.len_k - w.seq.len_q;
        add_alibi(
            scores, [&](int r) { return diag0 + get<0>(score_coords(r, 0)); },
            [&](int r, int c) { return key0 + get<1>(score_coords(r, c)); }, [&](int) { return slope; });
      }
      if (key0 < unmasked_begin || key0 + kBlockN > unmasked_end)
        mask_scores(scores, [&](int r, int c) { return key0 + get<1>(score_coords(r, c)); }, row_keys);
    };
    // The online softmax's step on the block's logits; under block quantization with K's chunk
    // factors, unless softcap has applied them.
    auto softmax_step = [&](auto first, [[maybe_unused]] int block) {
      constexpr bool kFirst = decltype(first)::value;
      if constexpr (kKeyBlockScales) {
        if (p.transform != ScoreTransform::softcap)
          return softmax.template step<kFirst>(scores, key_factors(block).chunk);
      }
      return softmax.template step<kFirst>(scores);
    };
    // Dropout on the probabilities of `block`: its keep bits, drawn right after its S GEMM is
    // issued (the warpgroup would only wait for S), then applied after its softmax step.
    auto draw_keep = [&](int block) -> std::uint64_t {
      if constexpr (kDropout)
        return draw_keep_bits(p.dropout, drop_coords, tile_batch_head, tile_row0, block * kBlockN);
      else
        return 0;
    };
    auto drop = [&]([[maybe_unused]] std::uint64_t keep) {
      if constexpr (kDropout) {
        Tensor acc = gmma_as_m16n8(tSrS);
        zero_dropped(acc, keep);
      }
    };
    // P in the dtype of V, same registers order as S (tOrP only views them as an A operand);
    // FP8, rearranged within quads.
    auto to_probabilities = [&]() {
      if constexpr (Traits::kFp8) {
        probabilities_to_e4m3_operand(tSrS, tOrP);
        return;
      }
      constexpr int kSize = decltype(size(tSrS))::value;
      cutlass::NumericArrayConverter<Element, float, kSize> convert;
      *reinterpret_cast<cutlass::Array<Element, kSize>*>(tOrP.data()) =
          convert(*reinterpret_cast<cutlass::Array<float, kSize> const*>(tSrS.data()));
    };

    softmax.reset();
    clear(tOrO);
    pipeline_q.consumer_wait(state_q);
    if constexpr (Traits::kQueryInRegisters) {
      if (!mine.empty()) load_a_fragment<typename Traits::SmemCopyQ>(mma_qk, thread, sQ(_, _, state_q.index()), tSrQ);
      pipeline_q.consumer_release(state_q);  // the stage is read (or not needed)
    }
    auto&& tSrQ_tile = query_operand<Traits>(tSrQ, state_q.index());

    // The tile's schedule, the same for every warpgroup: one turn per key block b, last to
    // first, that computes S of b and P.V of b + 1 (consuming K of b and V of b + 1), then a
    // turn for P.V of the first block. A warpgroup computes in the turns of its own blocks and
    // sits out the others: it waits for the stages a turn consumes, takes and passes the turn,
    // and frees the stages.
    //
    // Freeing K or V of `block` once this warpgroup is done reading it. Above head dim 128 the
    // tile's last K stage (block == blocks.begin) is kept by warpgroup 0 and its last V stage by
    // warpgroup 1 for their output (forward_traits.cuh); the other warpgroup frees it and tells
    // the keeper, through `read_barrier`, that it has finished reading.
    auto release_stage = [&](auto& pipeline, auto& state, int block, int keeper, uint32_t read_barrier) {
      if (Traits::kOutputInKVStages && block == blocks.begin) {
        if (warp_group == keeper) {
          held_stage = state;
          ++state;
          return;
        }
        cutlass::arch::NamedBarrier::arrive(2 * 128, read_barrier);
      }
      pipeline.consumer_release(state);
      ++state;
    };
    auto release_k = [&](int block) {
      release_stage(pipeline_k, state_k, block, Traits::kKeyStageKeeper, kBarrierLastKeyStageRead);
    };
    auto release_v = [&](int block) {
      release_stage(pipeline_v, state_v, block, Traits::kValueStageKeeper, kBarrierLastValueStageRead);
    };
    // The turn of S of key block `block` (blocks.begin - 1: the tile's last turn).
    auto sit_out_turn = [&](int block) {
      const bool k = block >= blocks.begin, v = block + 1 < blocks.end;
      if (k) pipeline_k.consumer_wait(state_k);
      turns.wait_turn();
      if (v) pipeline_v.consumer_wait(state_v);
      turns.pass_turn();
      if (k) release_k(block);
      if (v) release_v(block + 1);
    };
    // Every QK^T of this warpgroup is complete (Q from shared memory).
    auto release_q = [&]() {
      if constexpr (!Traits::kQueryInRegisters) pipeline_q.consumer_release(state_q);
    };
    if constexpr (Traits::kSerialMainloop) {
      // One turn per key block, for its S only; P.V follows the softmax outside the turns and is
      // complete before the next S is issued (forward_traits.cuh: kSerialMainloop).
      auto sit_out_block = [&](int block) {
        pipeline_k.consumer_wait(state_k);
        turns.wait_turn();
        turns.pass_turn();
        release_k(block);
        pipeline_v.consumer_wait(state_v);
        release_v(block);
      };
      auto compute_block = [&](auto first, int block) {
        pipeline_k.consumer_wait(state_k);
        turns.wait_turn();
        warpgroup_gemm<true>(mma_qk, tSrQ_tile, tSrK(_, _, _, state_k.index()), tSrS);
        turns.pass_turn();
        warpgroup_wait<0>();
        release_k(block);
        to_logits(block);
        const auto correction = softmax_step(first, block);
        to_probabilities();
        Softmax::rescale(out, correction);
        pipeline_v.consumer_wait(state_v);
        warpgroup_gemm<false>(mma_pv, tOrP, tOrV(_, _, _, state_v.index()), tOrO);
        warpgroup_wait<0>();
        release_v(block);
      };
      int block = blocks.end - 1;
      if (mine.empty()) {
        for (; block >= blocks.begin; --block) sit_out_block(block);
      } else {
        for (; block >= mine.end; --block) sit_out_block(block);
        compute_block(std::true_type{}, block--);
        for (; block >= mine.begin; --block) compute_block(std::false_type{}, block);
        for (; block >= blocks.begin; --block) sit_out_block(block);
      }
      release_q();
    } else if (mine.empty()) {
      for (int block = blocks.end - 1; block >= blocks.begin - 1; --block) {
        sit_out_turn(block);
        if (block == blocks.begin) release_q();
      }
    } else {
      int block = blocks.end - 1;
      for (; block >= mine.end; --block) sit_out_turn(block);

      // This warpgroup's last key block: S only (the turn's P.V, if the tile has a block
      // beyond, is not ours).
      const bool foreign_v = block + 1 < blocks.end;
      pipeline_k.consumer_wait(state_k);
      trace(TraceEvent::operands);
      turns.wait_turn();
      trace(TraceEvent::turn);
      warpgroup_gemm<true>(mma_qk, tSrQ_tile, tSrK(_, _, _, state_k.index()), tSrS);
      if (foreign_v) pipeline_v.consumer_wait(state_v);
      turns.pass_turn();
      [[maybe_unused]] std::uint64_t keep = draw_keep(block);
      warpgroup_wait<0>();
      trace(TraceEvent::s_done);
      release_k(block);
      if (foreign_v) release_v(block + 1);
      to_logits(block);
      auto correction = softmax_step(std::true_type{}, block);
      drop(keep);
      to_probabilities();
      trace(TraceEvent::softmax);

      // Middle blocks: S of block j - 1 computes while O is rescaled for, and then accumulates,
      // P_j V_j.
      for (--block; block >= mine.begin; --block) {
        pipeline_k.consumer_wait(state_k);
        turns.wait_turn();
        trace(TraceEvent::turn);
        warpgroup_gemm<true>(mma_qk, tSrQ_tile, tSrK(_, _, _, state_k.index()), tSrS);
        Softmax::rescale(out, correction);
        pipeline_v.consumer_wait(state_v);
        warpgroup_gemm<false>(mma_pv, tOrP, tOrV(_, _, _, state_v.index()), tOrO);
        turns.pass_turn();
        keep = draw_keep(block);  // while S (and P.V) run
        warpgroup_wait<1>();  // S done; P.V may still run
        trace(TraceEvent::s_done);
        release_k(block);
        to_logits(block);
        correction = softmax_step(std::false_type{}, block);
        drop(keep);
        trace(TraceEvent::softmax);
        warpgroup_wait<0>();  // P.V done: its P registers may be overwritten
        trace(TraceEvent::pv_done);
        release_v(block + 1);
        to_probabilities();
      }
      release_q();

      // This warpgroup's first key block: P.V only, in the turn of the block before it (whose
      // S is not ours) or in the tile's last turn.
      const bool foreign_k = block >= blocks.begin;
      Softmax::rescale(out, correction);
      if (foreign_k) pipeline_k.consumer_wait(state_k);
      pipeline_v.consumer_wait(state_v);
      turns.wait_turn();
      trace(TraceEvent::turn);
      warpgroup_gemm<false>(mma_pv, tOrP, tOrV(_, _, _, state_v.index()), tOrO);
      turns.pass_turn();
      warpgroup_wait<0>();
      trace(TraceEvent::pv_done);
      if (foreign_k) release_k(block);
      release_v(block + 1);
      if (foreign_k)
        for (--block; block >= blocks.begin - 1; --block) sit_out_turn(block);
    }

    // The epilogue runs for a warpgroup without key blocks too (at d > 128 it waits for the
    // other warpgroup to be done with its staging): its rows that lie in the sequence get
    // output 0 and LSE -inf. A segment of a split tile stores only if it is the last of the
    // tile's segments to finish, with the others' partials merged in (forward_tail_split.cuh).
    bool store = true;
    if constexpr (Traits::kTailSplit) {
      if (slot.work.segment_slot >= 0 && has_rows)
        store = finish_segment<Traits::kConsumerWarpGroups, Traits::kHeadDim>(
            p.tail, p.partials, p.tail_arrivals, smem.tail_arrived[warp_group], slot.work.segment_slot, softmax, out,
            warp_group, thread % 128, kBarrierEpilogueWarpGroup0 + warp_group);
    }
    if (store) {
      float lse[kRows];
      if (mine.empty() && slot.work.segment_slot < 0) {
#pragma unroll
        for (int r = 0; r < kRows; ++r) lse[r] = -INFINITY;
      } else {
        softmax.finalize(out, p.logit_scale * tile_logit_descale, lse);
        if constexpr (Traits::kFp8) {
#pragma unroll
          for (int i = 0; i < size(tOrO); ++i) tOrO(i) *= tile_v_descale;
        }
        if constexpr (kDropout) {
#pragma unroll
          for (int i = 0; i < size(tOrO); ++i) tOrO(i) *= p.dropout.keep_scale;
        }
      }
      trace(TraceEvent::finalized);
      ForwardEpilogue<Traits>::store(p, smem, held_stage.index(), slot.work, tOrO, out_coords, lse, thread);
      trace(TraceEvent::stored);
    }
    if constexpr (Traits::kOutputInKVStages) {  // the store has read the stage
      if (warp_group == Traits::kKeyStageKeeper)
        pipeline_k.consumer_release(held_stage);
      else
        pipeline_v.consumer_release(held_stage);
    }
    ++state_q;
    next_tile();
  }
  if (thread % 128 == 0) tma_store_wait<0>();  // shared memory must outlive the last store
}

}  // namespace flashattn::cuda::sm90
