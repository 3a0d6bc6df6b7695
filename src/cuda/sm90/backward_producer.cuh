#pragma once
// The producer warpgroup of the sm90 backward: its warp 0 issues every TMA load (the CTA's K and
// V once, then per step Q with its LSE rows and dO with its D rows, each into the next free stage
// of its pipeline); its warp 1 adds each step's dQ, which the consumer warpgroups stage in shared
// memory, into the fp32 accumulator in global memory with one bulk reduce-add per staging buffer
// (one per warpgroup, or at d = 64 one that both warpgroups' partial sums share). In
// deterministic mode it adds in key-block order, last to first: it waits until the tiles of the
// key blocks after its own have added theirs to the block (a counter per query head and dQ
// block). Last to first because under a causal or local mask a later key block's tile starts at
// a later query block and so runs ahead of an earlier one's; first to first, each tile waited for
// its predecessor at every step (2026-11-26, H200, causal: 0.07-0.24x the default mode's speed).
// At head dims 192 and 256 the consumers add half of dQ themselves and stage the other half in
// the part of the step's dO stage that they have finished reading, and warp 1 adds it from there
// (run_dq_writer_split); in deterministic mode they do so in the dQ block's turn, which warp 2 takes
// (run_dq_turn_taker) and warp 1 passes on.
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/pipeline/pipeline.hpp>

#include "cuda/sm90/backward_dq_turns.cuh"
#include "cuda/sm90/backward_params.cuh"
#include "cuda/sm90/backward_tile.cuh"

namespace flashattn::cuda::sm90 {

// One tile's loads. state: the Q/dO pipelines' position; kv_tiles: tiles of this CTA that loaded
// K and V so far. Both carry over to the CTA's next tile, whose K and V load as soon as the
// consumers are done reading this tile's, while they still store its dK and dV.
template <class Traits>
CUTE_DEVICE void run_backward_loads(BackwardParams<Traits> const& p, typename Traits::SharedStorage& smem,
                                    BackwardTile const& t, typename Traits::PipelineQ& pipeline_q,
                                    typename Traits::PipelinedO& pipeline_do,
                                    typename Traits::PipelineQ::PipelineState& state, int& kv_tiles, bool leader) {
  using namespace cute;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kHeadDim = Traits::kHeadDim;
  if (t.steps == 0) return;

  Tensor mQ = p.tma_q.get_tma_tensor(p.shape_q);
  Tensor mdO = p.tma_dout.get_tma_tensor(p.shape_q);
  Tensor mK = p.tma_k.get_tma_tensor(p.shape_k);
  Tensor mV = p.tma_v.get_tma_tensor(p.shape_k);
  Tensor mLSE = p.tma_lse.get_tma_tensor(p.shape_stats);
  Tensor mD = p.tma_delta.get_tma_tensor(p.shape_stats);
  Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Traits::SmemLayoutQ{});
  Tensor sdO = make_tensor(make_smem_ptr(smem.dout.data()), typename Traits::SmemLayoutdO{});
  Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Traits::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(smem.v.data()), typename Traits::SmemLayoutV{});
  Tensor sLSE = make_tensor(make_smem_ptr(smem.lse.data()), typename Traits::SmemLayoutRowStats{});
  Tensor sD = make_tensor(make_smem_ptr(smem.delta.data()), typename Traits::SmemLayoutRowStats{});
  auto tma_q = p.tma_q.get_slice(_0{});
  auto tma_do = p.tma_dout.get_slice(_0{});
  auto tma_k = p.tma_k.get_slice(_0{});
  auto tma_v = p.tma_v.get_slice(_0{});
  auto tma_lse = p.tma_lse.get_slice(_0{});
  auto tma_d = p.tma_delta.get_slice(_0{});

  const int batch = p.cu_seqlens_q ? 0 : t.batch;  // varlen: one packed sequence axis
  const int row_q = int(t.seq.row_q), row_k = int(t.seq.row_k), dense_q = int(t.seq.dense_q);
  if (kv_tiles > 0) cutlass::arch::ClusterBarrier::wait(&smem.kv_free, (kv_tiles - 1) & 1);
  ++kv_tiles;
  if (leader) {
    Tensor gK = local_tile(domain_offset(make_coord(row_k, _0{}), mK(_, _, t.kv_head, batch)),
                           Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(t.n_block, _0{}));
    Tensor gV = local_tile(domain_offset(make_coord(row_k, _0{}), mV(_, _, t.kv_head, batch)),
                           Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(t.n_block, _0{}));
    auto& kv_loaded = *reinterpret_cast<cutlass::arch::ClusterTransactionBarrier::ValueType*>(&smem.kv_loaded);
    cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&smem.kv_loaded, Traits::kKeyValueBytes);
    copy(p.tma_k.with(kv_loaded, 0, TMA::CacheHintSm90::EVICT_FIRST), tma_k.partition_S(gK), tma_k.partition_D(sK));
    copy(p.tma_v.with(kv_loaded, 0, TMA::CacheHintSm90::EVICT_FIRST), tma_v.partition_S(gV), tma_v.partition_D(sV));
  }

  // The row statistics of a step: from the 4-row boundary at or before its first row
  // (backward_traits.cuh).
  auto stats_row = [&](BackwardTile::Step step) { return (dense_q + step.m_block * kBlockM) & ~3; };
  // Q and dO of a head are read by every key block's CTA: keep them in L2.
  for (int s = 0; s < t.steps; ++s) {
    const BackwardTile::Step step = t.step(s);
    pipeline_q.producer_acquire(state);
    if (leader) {
      Tensor gQ = local_tile(domain_offset(make_coord(row_q, _0{}), mQ(_, _, step.head, batch)),
                             Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(step.m_block, _0{}));
      Tensor gLSE = local_tile(domain_offset(make_coord(stats_row(step)), mLSE(_, step.head)),
                               Shape<Int<Traits::kStatRows>>{}, make_coord(0));
      auto& full = *pipeline_q.producer_get_barrier(state);
      copy(p.tma_q.with(full, 0, TMA::CacheHintSm90::EVICT_LAST), tma_q.partition_S(gQ),
           tma_q.partition_D(sQ(_, _, state.index())));
      copy(p.tma_lse.with(full, 0, TMA::CacheHintSm90::EVICT_LAST), tma_lse.partition_S(gLSE),
           tma_lse.partition_D(sLSE(_, state.index())));
    }
    pipeline_do.producer_acquire(state);
    if (leader) {
      Tensor gdO = local_tile(domain_offset(make_coord(row_q, _0{}), mdO(_, _, step.head, batch)),
                              Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(step.m_block, _0{}));
      Tensor gD = local_tile(domain_offset(make_coord(stats_row(step)), mD(_, step.head)),
                             Shape<Int<Traits::kStatRows>>{}, make_coord(0));
      auto& full = *pipeline_do.producer_get_barrier(state);
      copy(p.tma_dout.with(full, 0, TMA::CacheHintSm90::EVICT_LAST), tma_do.partition_S(gdO),
           tma_do.partition_D(sdO(_, _, state.index())));
      copy(p.tma_delta.with(full, 0, TMA::CacheHintSm90::EVICT_LAST), tma_d.partition_S(gD),
           tma_d.partition_D(sD(_, state.index())));
    }
    ++state;
  }
}

// cp.reduce.async.bulk: adds `bytes` of fp32 from shared memory into global memory (at L2),
// completing in the thread's bulk async-group.
CUTE_DEVICE void bulk_reduce_add(float* dst, float const* src, uint32_t bytes) {
  const uint32_t src_addr = cute::cast_smem_ptr_to_uint(src);
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
               "r"(src_addr), "r"(bytes)
               : "memory");
}

// Deterministic mode: lets the next key block's CTA add its share of the dQ block once the adds
// ordered before this (this thread's, and those of threads it has synchronized with: cumulative at
// GPU scope) are performed. A release reduction rather than a fence and an atomic: `__threadfence`
// is a sequentially consistent fence (MEMBAR.SC.GPU), stronger than this hand-over needs.
CUTE_DEVICE void release_turn(int* counter) {
  asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(counter) : "memory");
}

// The same after this thread's bulk reduce-adds are complete in global memory.
CUTE_DEVICE void pass_turn(int* counter) {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
  release_turn(counter);
}

template <class Traits>
CUTE_DEVICE void run_dq_writer(BackwardParams<Traits> const& p, typename Traits::SharedStorage& smem,
                               BackwardTile const& t, int lane) {
  using NamedBarrier = cutlass::arch::NamedBarrier;
  constexpr int kThreads = 128 + 32;  // one consumer warpgroup and this warp
  constexpr uint32_t kBytes = Traits::kDqElems * sizeof(float);
  // A staging buffer per column slice of the block: one per consumer warpgroup, or one for both
  // (kDqOverOwnKeys: they sum there).
  constexpr int kBuffers = Traits::kDqSlices;
  const std::int64_t first_block = p.dq_layout.first_block(t.batch, t.seq.dense_q);
  auto release_staging = [&] {  // once the adds issued so far have read the staging buffers
    if (lane == 0) cute::tma_store_wait<0>();
    __syncwarp();
#pragma unroll
    for (int w = 0; w < kBuffers; ++w) NamedBarrier::arrive(kThreads, kBarrierDqEmpty0 + w);
  };
  for (int s = 0; s < t.steps; ++s) {
    const BackwardTile::Step step = t.step(s);
    const std::int64_t block = first_block + step.m_block;
    float* dst = p.dq_accum + p.dq_layout.block_offset(step.head, block);
    // The staging is free for this step once the previous step's adds have read it: signalled at
    // the end of the previous step within a tile (below), here for a tile's first.
    if (s == 0) release_staging();
    int* counter = nullptr;  // deterministic mode: this step's dQ block's
    if (p.dq_semaphore != nullptr) {
      counter = dq_turn_counter(p, step.head, block);
      const int expected = dq_turn_expected(p, t, step.m_block);
      if (lane == 0) {
        wait_for_turn(counter, expected);
        // Order this thread's coming bulk reduce-adds (async proxy) after the acquire.
        asm volatile("fence.proxy.async.global;\n" ::: "memory");
      }
    }
#pragma unroll
    for (int w = 0; w < kBuffers; ++w) {
      NamedBarrier::sync(kThreads, kBarrierDqFull0 + w);
      if (lane == 0) bulk_reduce_add(dst + w * Traits::kDqElems, smem.dq.data() + w * Traits::kDqElems, kBytes);
    }
    if (lane == 0) cute::tma_store_arrive();  // commits the step's adds as one group
    // The turn passes as soon as the adds are complete: the next key block's tile waits for it,
    // and the consumers need the staging only at the end of their next step. (Waiting for the
    // adds to have read the staging compiles to the same scoreboard wait as waiting for their
    // completion, so freeing the staging first would not free it sooner.)
    if (lane == 0 && counter != nullptr) pass_turn(counter);
    if (s + 1 < t.steps) release_staging();
    __syncwarp();
  }
}

// Arrives `count` times at once on a pipeline's empty barrier, for consumers that left the
// release of their stage to this thread.
CUTE_DEVICE void release_stage_for(cutlass::arch::ClusterBarrier& empty, uint32_t count) {
  uint64_t token;
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 %0, [%1], %2;\n"
               : "=l"(token)
               : "r"(cute::cast_smem_ptr_to_uint(&empty)), "r"(count)
               : "memory");
}

// Head dims 192 and 256: each consumer warpgroup adds half of a step's dQ with reductions from
// registers and stages the other half in its half of the step's dO stage once its dV GEMM has read
// it (backward_consumer_split.cuh); this warp adds the staged halves with bulk reduce-adds and,
// once they have read the stage, releases it to the loads in the consumers' place. Both
// warpgroups' arrivals are taken before either add is issued. A warpgroup signals on a barrier of
// the stage's own (dq_staged_barrier): it may arrive for the next step before this warp takes this
// step's arrival, but not for the step after, whose dO loads into this step's stage only once this
// warp has released it.
//
// Deterministic mode (kOrdered): the warpgroups add only in the dQ block's turn, which warp 2 takes
// for them (run_dq_turn_taker), and this warp passes it on once their reductions are issued and its
// own adds are complete: after releasing the stage, so that neither the wait for its adds nor the
// release's fence holds the stage, while warp 2 polls for the next turn. At 192 the warpgroups add
// all of dQ from registers (BackwardTraits::kOrderedDqStaged) and signal the same barriers when
// their reductions are issued; this warp then only passes the turns.
template <class Traits, bool kOrdered>
CUTE_DEVICE void run_dq_writer_split(BackwardParams<Traits> const& p, typename Traits::SharedStorage& smem,
                                     BackwardTile const& t, typename Traits::PipelineQ::PipelineState& state,
                                     int lane) {
  using NamedBarrier = cutlass::arch::NamedBarrier;
  static_assert(Traits::kSplitHeadDim);
  constexpr int kThreads = kOrdered ? kOrderedStagedThreads : 128 + 32;  // a warpgroup, this warp (and warp 2)
  constexpr int kHalves = Traits::kConsumerWarpGroups;
  constexpr uint32_t kStagedBytes = Traits::kDqElems / 2 * sizeof(float);
  const std::int64_t first_block = p.dq_layout.first_block(t.batch, t.seq.dense_q);
  for (int s = 0; s < t.steps; ++s) {
    const BackwardTile::Step step = t.step(s);
    const int stage = state.index();
    const std::int64_t block = first_block + step.m_block;
    float* dst = p.dq_accum + p.dq_layout.block_offset(step.head, block);
#pragma unroll
    for (int w = 0; w < kHalves; ++w) NamedBarrier::sync(kThreads, dq_staged_barrier(stage, w));
    // In deterministic mode the barriers order the warpgroups' reductions before the turn's release.
    if (lane == 0) {
      if constexpr (kOrdered && !Traits::kOrderedDqStaged) {
        release_turn(dq_turn_counter(p, step.head, block));
      } else {
        // Order the bulk reduce-adds (async proxy) after the turn's acquire, which reached this
        // warp through warp 2's and the warpgroups' barriers.
        if constexpr (kOrdered) asm volatile("fence.proxy.async.global;\n" ::: "memory");
#pragma unroll
        for (int w = 0; w < kHalves; ++w)
          bulk_reduce_add(dst + w * Traits::kDqElems, Traits::dq_staging(smem.dout.data(), stage, w), kStagedBytes);
        cute::tma_store_arrive();   // commits the step's adds as one group
        cute::tma_store_wait<0>();  // ... which have read the stage
        release_stage_for(smem.pipeline_do.empty_barrier_[stage], Traits::kConsumerThreads);
        if constexpr (kOrdered) pass_turn(dq_turn_counter(p, step.head, block));
      }
    }
    __syncwarp();
    ++state;
  }
}

// Head dims 192 and 256, deterministic mode: warp 2 takes each step's dQ turn for both warpgroups
// (kBarrierDqTurnTaken0 + w) and then waits, beside warp 1, for their staging barriers, so that it
// arrives for a step's turn only after both warpgroups have passed the step before's: no arrival
// counts toward the wrong step. Warp 1 (run_dq_writer_split) passes the turn on. Taking the turns
// apart from the warp that passes them, whose release waits until the reductions are performed,
// and one turn per block instead of one per warpgroup half: 0.86-0.97x the default at d = 192
// against 0.76-0.82x with one warp keeping both (H100, 2026-11-27, docs/kernels/sm90-backward.md).
template <class Traits>
CUTE_DEVICE void run_dq_turn_taker(BackwardParams<Traits> const& p, BackwardTile const& t,
                                   typename Traits::PipelineQ::PipelineState& state, int lane) {
  using NamedBarrier = cutlass::arch::NamedBarrier;
  static_assert(Traits::kSplitHeadDim);
  constexpr int kWarpGroups = Traits::kConsumerWarpGroups;
  const std::int64_t first_block = p.dq_layout.first_block(t.batch, t.seq.dense_q);
  for (int s = 0; s < t.steps; ++s) {
    const BackwardTile::Step step = t.step(s);
    const int stage = state.index();
    if (lane == 0)
      wait_for_turn(dq_turn_counter(p, step.head, first_block + step.m_block), dq_turn_expected(p, t, step.m_block));
    __syncwarp();
#pragma unroll
    for (int w = 0; w < kWarpGroups; ++w) NamedBarrier::arrive(kTurnTakenThreads, kBarrierDqTurnTaken0 + w);
#pragma unroll
    for (int w = 0; w < kWarpGroups; ++w) NamedBarrier::sync(kOrderedStagedThreads, dq_staged_barrier(stage, w));
    ++state;
  }
}

}  // namespace flashattn::cuda::sm90
