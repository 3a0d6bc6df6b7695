#pragma once
// The producer warp of the sm90 forward: plans each of the CTA's tiles (or segments of a tail
// tile, forward_tail_split.cuh), hands the plan to the consumers and issues every TMA load. Per
// tile: the first K block, then Q (into a free Q stage: up to head dim 128 there are two, so the
// next tile's Q arrives while this one runs; above, the one stage is free after the last QK^T,
// so it arrives while this one ends), then K and V interleaved in the order the consumers use
// them (K of block j - 1 before V of block j, since QK^T of the next block runs ahead of P.V of
// the current one). Paged K arrives in boxes of a page's keys; paged V is loaded by the other
// three warps of the warpgroup (forward_paged_kv.cuh); with Traits::kTransposeValue (FP8), V's rows
// go to stages from which those warps write V^T (fp8_value_transposer.cuh).
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/pipeline/pipeline.hpp>

#include "cuda/sm90/forward_paged_kv.cuh"
#include "cuda/sm90/forward_params.cuh"
#include "cuda/sm90/forward_tile.cuh"
#include "cuda/sm90/fp8_value_transpose.cuh"

namespace flashattn::cuda::sm90 {

// (X..., last) -> ((X...), last): one index picks a block or a stage.
template <class Tensor>
CUTE_DEVICE auto group_all_but_last(Tensor&& t) {
  constexpr int kRank = decltype(cute::rank(t))::value;
  return cute::group_modes<0, kRank - 1>(t);
}

// Where V's TMA loads go: with kTransposeValue, the stages of rows that the transposer reads; else
// the stages the P.V GEMM reads.
template <class Traits>
CUTE_DEVICE typename Traits::Element* value_load_stages(typename Traits::SharedStorage& smem) {
  if constexpr (Traits::kTransposeValue)
    return smem.v_rows.data();
  else
    return smem.v.data();
}

// pipeline_v: the pipeline of V's TMA loads (with kTransposeValue, of V's rows, whose consumer is
// the transposer).
template <class Traits>
CUTE_DEVICE void run_producer(ForwardParams<Traits> const& p, typename Traits::SharedStorage& smem,
                              typename Traits::PipelineQ& pipeline_q,
                              typename Traits::PipelineK& pipeline_k,
                              typename Traits::PipelineV& pipeline_v,
                              typename Traits::PipelineTile& pipeline_tile, bool leader) {
  constexpr bool kPaged = Traits::kPagedKv;
  using namespace cute;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kHeadDim = Traits::kHeadDim;

  Tensor mQ = p.tma_q.get_tma_tensor(p.shape_q);
  Tensor mK = p.tma_k.get_tma_tensor(p.shape_k);
  Tensor mV = p.tma_v.get_tma_tensor(p.shape_v);  // FP8's pre-pass: V^T, (head dim, keys, heads, batch)
  Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Traits::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Traits::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(value_load_stages<Traits>(smem)), typename Traits::SmemLayoutV{});
  auto tma_q = p.tma_q.get_slice(_0{});
  auto tma_k = p.tma_k.get_slice(_0{});
  auto tma_v = p.tma_v.get_slice(_0{});
  Tensor tKsK = group_all_but_last(tma_k.partition_D(sK));  // (TMA, stage)
  Tensor tVsV = group_all_but_last(tma_v.partition_D(sV));
  Tensor tQsQ = tma_q.partition_D(sQ);  // (TMA, 1, 1, stage)
  // Paged K (forward_paged_kv.cuh): page boxes and whole blocks over the pool; only in the paged
  // kernel (FP8, which never pages, could not even divide its stages into boxes). Paged V is the
  // value loader's (the other three warps).
  auto paged_k = [&] {
    if constexpr (kPaged)
      return make_paged_operand(sK, p.tma_k_page, p.tma_k_page.get_tma_tensor(p.shape_kv_page),
                                p.tma_k_page.get_slice(_0{}).partition_D(flat_divide(sK, typename Traits::PageBox{})),
                                p.tma_k, mK, p.tma_k.get_slice(_0{}).partition_D(sK));
    else
      return 0;
  }();
  const int lane = cutlass::canonical_lane_idx();

  auto state_q = cutlass::make_producer_start_state<typename Traits::PipelineQ>();
  auto state_k = cutlass::make_producer_start_state<typename Traits::PipelineK>();
  auto state_v = cutlass::make_producer_start_state<typename Traits::PipelineV>();
  auto state_tile = cutlass::make_producer_start_state<typename Traits::PipelineTile>();
  const int num_items = p.tail.num_items();

  // The consumers learn which work comes next (num_items or more: none) and its plan from a
  // slot of shared memory. The slot is taken before the plan is computed, so that the plan goes
  // to it as it is made: the 24 registers of head dim 256 hold no more.
  auto take_slot = [&]() {
    if (leader) pipeline_tile.producer_acquire(state_tile);
  };
  auto publish = [&](int index, TileWork const& w) {
    if (leader) {
      smem.tile_slot[state_tile.index()] = {index, w};
      pipeline_tile.producer_commit(state_tile);
    }
    ++state_tile;
  };

  for (int index = blockIdx.x; index < num_items;) {
    // A work item is a tile, or a unit of the tail: key blocks of one tile or of two.
    const int segments = work_segments(p, index);
    for (int s = 0; s < segments; ++s) {
      take_slot();
      const TileWork w = plan_work(p, index, s);
      publish(index, w);
      if (w.key_blocks.empty()) continue;  // nothing to load: the consumers write zeros
      const int head = w.coord.head, head_kv = head / p.group;
      const int batch = p.cu_seqlens_q ? 0 : w.coord.batch;  // varlen: one packed sequence axis
      Tensor gQ = local_tile(domain_offset(make_coord(w.seq.row_q, _0{}), mQ(_, _, head, batch)),
                             Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(w.coord.m_block, _0{}));
      Tensor gK = local_tile(domain_offset(make_coord(w.seq.row_k, _0{}), mK(_, _, head_kv, batch)),
                             Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, _0{}));  // (N, D, block)
      Tensor gV = [&] {
        // The pre-pass's V^T: variable-length sequences start at multiples of 16 keys.
        if constexpr (Traits::kFp8 && !Traits::kTransposeValue)
          return local_tile(domain_offset(make_coord(_0{}, p.cu_seqlens_q ? int(transposed_value_start(w.seq.row_k, w.coord.batch))
                                                                          : 0),
                                          mV(_, _, head_kv, batch)),
                            Shape<Int<kHeadDim>, Int<kBlockN>>{}, make_coord(_0{}, _));  // (D, N, block)
        else
          return local_tile(domain_offset(make_coord(w.seq.row_k, _0{}), mV(_, _, head_kv, batch)),
                            Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, _0{}));
      }();
      Tensor tQgQ = tma_q.partition_S(gQ);
      Tensor tKgK = group_all_but_last(tma_k.partition_S(gK));  // (TMA, block)
      Tensor tVgV = group_all_but_last(tma_v.partition_S(gV));

      // L2 policy: K and V are read by every query tile of their head (EVICT_LAST), Q by one
      // (EVICT_FIRST). At d = 128 n = 1k a call read 14% fewer bytes from DRAM
      // (docs/log/sm90-forward.md, DRAM traffic).
      auto load_block = [&](auto& pipeline, auto& state, auto const& tma, auto const& src, auto& dst, int block) {
        pipeline.producer_acquire(state);
        if (leader)
          copy(tma.with(*pipeline.producer_get_barrier(state), 0, TMA::CacheHintSm90::EVICT_LAST), src(_, block),
               dst(_, state.index()));
        ++state;
      };
      // Paged: K's lookup runs one load ahead (forward_paged_kv.cuh).
      const PagedKeyBlocks<Traits> pages{p, w.coord.batch, head_kv, w.seq.len_k, lane, leader};
      int next_key_pages = 0;
      if constexpr (kPaged) next_key_pages = pages.box_page(w.key_blocks.end - 1);
      auto load_k = [&](int block) {
        if constexpr (kPaged) {
          pages.load_keys(pipeline_k, state_k, paged_k, block, next_key_pages);
          if (block > w.key_blocks.begin) next_key_pages = pages.box_page(block - 1);
        } else {
          load_block(pipeline_k, state_k, p.tma_k, tKgK, tKsK, block);
        }
      };
      auto load_v = [&](int block) {
        if constexpr (!kPaged) load_block(pipeline_v, state_v, p.tma_v, tVgV, tVsV, block);
      };

      const int last = w.key_blocks.end - 1;
      load_k(last);
      // A Q stage is free once the consumers' last QK^T with the Q it held two tiles ago (one
      // tile ago above head dim 128) is complete.
      pipeline_q.producer_acquire(state_q);
      if (leader)
        copy(p.tma_q.with(*pipeline_q.producer_get_barrier(state_q), 0, TMA::CacheHintSm90::EVICT_FIRST), tQgQ,
             tQsQ(_, _, _, state_q.index()));
      ++state_q;
      for (int block = last - 1; block >= w.key_blocks.begin; --block) {
        load_k(block);
        load_v(block + 1);
      }
      load_v(w.key_blocks.begin);
    }
    // Claimed once this item's loads are issued, i.e. about two key blocks before the
    // consumers finish it: late enough that the claim balances the CTAs' work.
    int next = 0;
    if (leader) next = atomicAdd(p.tile_counter, 1) + int(gridDim.x);
    index = __shfl_sync(0xffffffffu, next, 0);
  }
  take_slot();
  publish(num_items, TileWork{});
}

}  // namespace flashattn::cuda::sm90
