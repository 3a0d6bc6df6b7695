#pragma once
// The sm90 forward kernel: sets up shared memory and barriers, then splits into the producer
// warpgroup (TMA loads, few registers) and the consumer warpgroups (wgmma and softmax, many
// registers). Persistent: each CTA runs tiles until none is left; the producer claims them
// (common/tile_order.cuh), plans them and passes index and plan on to the consumers.
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/pipeline/pipeline.hpp>

#include "cuda/sm90/forward_consumer.cuh"
#include "cuda/sm90/forward_params.cuh"
#include "cuda/sm90/forward_producer.cuh"
#include "cuda/sm90/fp8_value_transposer.cuh"

namespace flashattn::cuda::sm90 {

// kDropout: dropout on P after the softmax (forward_consumer.cuh). kKeyBlockScales (FP8): K's
// descale factors per block of keys (block quantization), taken in the softmax step. Paged K/V
// (Traits::kPagedKv, forward_paged_kv.cuh): a kernel of its own, with traits of its own (the order
// of its stages' swizzle atoms), so that the others keep their code.
template <class Traits, class Softmax, bool kDropout = false, bool kKeyBlockScales = false>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    forward_kernel(const __grid_constant__ ForwardParams<Traits> params) {
  constexpr bool kPagedKv = Traits::kPagedKv;
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace cute;
  extern __shared__ __align__(1024) char smem_bytes[];
  auto& smem = *reinterpret_cast<typename Traits::SharedStorage*>(smem_bytes);

  const int warp = cutlass::canonical_warp_idx_sync();
  const int warp_group = cutlass::canonical_warp_group_idx();
  const bool producer_warp = warp == 0;
  const bool leader = producer_warp && cutlass::canonical_lane_idx() == 0;  // issues TMA

  if (leader) {
    cute::prefetch_tma_descriptor(params.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_v.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_o.get_tma_descriptor());
    if constexpr (kPagedKv) {
      cute::prefetch_tma_descriptor(params.tma_k_page.get_tma_descriptor());
      if (Traits::kPageBoxes && params.page_maps.coords.usable) {
        cute::prefetch_tma_descriptor(&params.page_maps.k_page);
        cute::prefetch_tma_descriptor(&params.page_maps.v_page);
      }
    }
  }

  using PipelineK = typename Traits::PipelineK;
  using PipelineV = typename Traits::PipelineV;
  typename PipelineK::Params pipeline_params;
  pipeline_params.role = warp_group == 0 ? PipelineK::ThreadCategory::Producer : PipelineK::ThreadCategory::Consumer;
  pipeline_params.is_leader = leader;
  pipeline_params.num_consumers = Traits::kConsumerThreads;
  pipeline_params.transaction_bytes = Traits::kKeyBytes;
  PipelineK pipeline_k(smem.pipeline_k, pipeline_params, Shape<_1, _1, _1>{});
  // Paged V is loaded, FP8 V^T written (kTransposeValue), by the producer warpgroup's other three
  // warps, each thread arriving on the stage's full barrier (run_value_loader,
  // run_value_transposer); none of them leads.
  typename PipelineV::Params value_params = pipeline_params;
  if constexpr (Traits::kValueWarps) {
    value_params.is_leader = false;
    value_params.num_producers = Traits::kValueWarpThreads;
  }
  PipelineV pipeline_v(smem.pipeline_v, value_params, Shape<_1, _1, _1>{});
  // kTransposeValue: the producer warp's TMA loads V's rows for the transposer (warps 1-3), which
  // releases them thread by thread. Other kernels: V's loads go to pipeline_v.
  auto pipeline_v_rows = [&] {
    if constexpr (Traits::kTransposeValue) {
      typename PipelineV::Params rows_params;
      rows_params.role = producer_warp ? PipelineV::ThreadCategory::Producer : PipelineV::ThreadCategory::Consumer;
      rows_params.is_leader = leader;
      rows_params.num_consumers = Traits::kValueWarpThreads;
      rows_params.transaction_bytes = Traits::kKeyBytes;
      return PipelineV(smem.pipeline_v_rows, rows_params, Shape<_1, _1, _1>{});
    } else {
      return 0;
    }
  }();
  // Q's pipeline is set up like K's (its own Params type when the stage counts differ). Written
  // out rather than through a shared helper: the helper cost both d = 64 kernels 12 more bytes
  // of register spills (ptxas, 2026-11-23).
  using PipelineQ = typename Traits::PipelineQ;
  typename PipelineQ::Params query_params;
  query_params.role = warp_group == 0 ? PipelineQ::ThreadCategory::Producer : PipelineQ::ThreadCategory::Consumer;
  query_params.is_leader = leader;
  query_params.num_consumers = Traits::kConsumerThreads;
  query_params.transaction_bytes = Traits::kQueryBytes;
  PipelineQ pipeline_q(smem.pipeline_q, query_params, Shape<_1, _1, _1>{});
  using PipelineTile = typename Traits::PipelineTile;
  typename PipelineTile::Params tile_params;
  // The value loader's or transposer's warps of the producer warpgroup read the tile slots too.
  tile_params.role = warp_group != 0        ? PipelineTile::ThreadCategory::Consumer
                     : Traits::kValueWarps ? PipelineTile::ThreadCategory::ProducerConsumer
                                           : PipelineTile::ThreadCategory::Producer;
  tile_params.producer_arv_count = 1;
  tile_params.consumer_arv_count = Traits::kConsumerThreads + (Traits::kValueWarps ? Traits::kValueWarpThreads : 0);
  tile_params.dst_blockid = 0;
  PipelineTile pipeline_tile(smem.pipeline_tile, tile_params);
  __syncthreads();  // barriers initialized before anyone waits on them

  if (warp_group == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegisters>();
    if (producer_warp) {
      if constexpr (Traits::kTransposeValue)
        run_producer<Traits>(params, smem, pipeline_q, pipeline_k, pipeline_v_rows, pipeline_tile, leader);
      else
        run_producer<Traits>(params, smem, pipeline_q, pipeline_k, pipeline_v, pipeline_tile, leader);
    } else if constexpr (kPagedKv) {
      run_value_loader<Traits>(params, smem, pipeline_v, pipeline_tile, int(threadIdx.x) - 32);
    } else if constexpr (Traits::kTransposeValue) {
      run_value_transposer<Traits>(params, smem, pipeline_v_rows, pipeline_v, pipeline_tile, int(threadIdx.x) - 32);
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegisters>();
    run_consumers<Traits, Softmax, kDropout, kKeyBlockScales>(params, smem, pipeline_q, pipeline_k, pipeline_v, pipeline_tile,
                                   int(threadIdx.x) - 128, warp_group - 1);
  }
#endif
}

}  // namespace flashattn::cuda::sm90
