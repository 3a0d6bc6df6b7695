#pragma once
// The sm90 backward kernel: sets up shared memory and barriers, then splits into the producer
// warpgroup (warp 0: TMA loads; warp 1: dQ reduce-adds where the consumers stage dQ; few
// registers) and the two consumer warpgroups (wgmma and the element-wise middle, many
// registers; backward_consumer.cuh, or backward_consumer_split.cuh at head dims 192 and 256, where
// warp 1 adds the half of dQ the consumers stage, and in deterministic mode warps 2 and 1 take and
// pass their dQ turns).
// Persistent: one CTA per SM takes tiles (blocks of keys, backward_tile.cuh) until none is left.
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/pipeline/pipeline.hpp>

#include "cuda/sm90/backward_consumer.cuh"
#include "cuda/sm90/backward_consumer_split.cuh"
#include "cuda/sm90/backward_params.cuh"
#include "cuda/sm90/backward_producer.cuh"
#include "cuda/sm90/backward_tile.cuh"

namespace flashattn::cuda::sm90 {

// kOrderedDq: deterministic mode at head dims 192 and 256 (warps 2 and 1 take and pass the dQ
// turns: backward_producer.cuh); below, the dQ writer warp orders the adds in every instance.
template <class Traits, bool kSoftcap, bool kDropout = false, bool kAlibi = false, bool kOrderedDq = false>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    backward_kernel(const __grid_constant__ BackwardParams<Traits> params) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace cute;
  extern __shared__ __align__(1024) char smem_bytes[];
  auto& smem = *reinterpret_cast<typename Traits::SharedStorage*>(smem_bytes);

  const int warp = cutlass::canonical_warp_idx_sync();
  const int warp_group = cutlass::canonical_warp_group_idx();
  const int lane = cutlass::canonical_lane_idx();
  const bool leader = warp == 0 && lane == 0;  // issues TMA

  if (leader) {
    cute::prefetch_tma_descriptor(params.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_dout.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_v.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_lse.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_delta.get_tma_descriptor());
    cutlass::arch::ClusterTransactionBarrier::init(&smem.kv_loaded, 1);
    cutlass::arch::ClusterBarrier::init(&smem.kv_free, Traits::kConsumerThreads);
  }

  using PipelineQ = typename Traits::PipelineQ;
  using PipelinedO = typename Traits::PipelinedO;
  typename PipelineQ::Params q_params;
  q_params.role = warp_group == 0 ? PipelineQ::ThreadCategory::Producer : PipelineQ::ThreadCategory::Consumer;
  q_params.is_leader = leader;
  q_params.num_consumers = Traits::kConsumerThreads;
  q_params.transaction_bytes = Traits::kQueryBytes;
  PipelineQ pipeline_q(smem.pipeline_q, q_params, Shape<_1, _1, _1>{});
  typename PipelinedO::Params do_params = q_params;
  PipelinedO pipeline_do(smem.pipeline_do, do_params, Shape<_1, _1, _1>{});
  using PipelineTile = typename Traits::PipelineTile;
  typename PipelineTile::Params tile_params;
  tile_params.role = warp == 0 ? PipelineTile::ThreadCategory::Producer : PipelineTile::ThreadCategory::Consumer;
  tile_params.producer_arv_count = 1;
  tile_params.consumer_arv_count = Traits::kTileReaders + (kOrderedDq ? 32 : 0);  // + the turn taker
  tile_params.dst_blockid = 0;
  PipelineTile pipeline_tile(smem.pipeline_tile, tile_params);
  cutlass::arch::fence_barrier_init();
  __syncthreads();  // barriers initialized before anyone waits on them

  // Persistent: the producer warp claims tiles (backward_tile.cuh) in order and hands each index
  // to the other roles through a slot of shared memory (num_tiles: none left).
  typename PipelineTile::PipelineState tile_state;
  auto next_tile = [&]() {  // the other roles: the next index, read and the slot released
    pipeline_tile.consumer_wait(tile_state);
    const int index = smem.tile_slot[tile_state.index()];
    pipeline_tile.consumer_release(tile_state);
    ++tile_state;
    return index;
  };
  if (warp_group == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegisters>();
    if (warp == 0) {
      auto state = cutlass::make_producer_start_state<PipelineQ>();
      int kv_tiles = 0;
      tile_state = cutlass::make_producer_start_state<PipelineTile>();
      for (int index = blockIdx.x;;) {
        if (leader) {
          pipeline_tile.producer_acquire(tile_state);
          smem.tile_slot[tile_state.index()] = index;
          pipeline_tile.producer_commit(tile_state);
        }
        ++tile_state;
        if (index >= params.num_tiles) break;
        run_backward_loads(params, smem, backward_tile(params, index), pipeline_q, pipeline_do, state, kv_tiles,
                           leader);
        int next = 0;
        if (leader) next = atomicAdd(params.tile_counter, 1) + int(gridDim.x);
        index = __shfl_sync(0xffffffffu, next, 0);
      }
    } else if (warp == 1) {
      if constexpr (!Traits::kSplitHeadDim) {
        for (int index = next_tile(); index < params.num_tiles; index = next_tile())
          run_dq_writer(params, smem, backward_tile(params, index), lane);
        if (lane == 0) cute::tma_store_wait<0>();  // shared memory must outlive the last add's read
      } else {
        typename PipelineQ::PipelineState state;  // the stages the consumers stage dQ in
        for (int index = next_tile(); index < params.num_tiles; index = next_tile())
          run_dq_writer_split<Traits, kOrderedDq>(params, smem, backward_tile(params, index), state, lane);
      }
    } else if constexpr (kOrderedDq) {
      if (warp == 2) {
        typename PipelineQ::PipelineState state;  // as warp 1's
        for (int index = next_tile(); index < params.num_tiles; index = next_tile())
          run_dq_turn_taker(params, backward_tile(params, index), state, lane);
      }
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegisters>();
    ConsumerCarry<Traits> carry{{}, 0, Tracer(params.trace)};
    for (int index = next_tile(); index < params.num_tiles; index = next_tile()) {
      const BackwardTile tile = backward_tile(params, index);
      if constexpr (Traits::kSplitHeadDim)
        run_backward_consumer_split<Traits, kSoftcap, kDropout, kAlibi, kOrderedDq>(
            params, smem, tile, pipeline_q, pipeline_do, carry, int(threadIdx.x) % 128, warp_group - 1);
      else
        run_backward_consumer<Traits, kSoftcap, kDropout, kAlibi>(params, smem, tile, pipeline_q, pipeline_do, carry,
                                                                 int(threadIdx.x) % 128, warp_group - 1);
    }
  }
#endif
}

}  // namespace flashattn::cuda::sm90
