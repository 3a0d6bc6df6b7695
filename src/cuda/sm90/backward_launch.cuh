#pragma once
// Host side of the sm90 backward: plans the workspace and enqueues, on the problem's stream
// (nothing synchronizes):
//   1. D = rowsum(dO * O) and LSE * log2(e) per query row (the sm80 family's row pass), which
//      also clears the fp32 dQ accumulator;
//   2. the main kernel (backward_kernel.cuh): dK, dV, and dQ added into an fp32 accumulator;
//   3. dq = scale * accumulator (backward_dq_convert.cuh);
//   4. GQA with the group split over CTAs: fixed-order sum of the dK/dV partials (sm80's pass).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include <cute/tensor.hpp>

#include "cuda/common/check.cuh"
#include "cuda/common/stream_workspace.cuh"
#include "cuda/sm80/backward_config.cuh"
#include "cuda/sm80/backward_params.cuh"
#include "cuda/sm80/backward_rowwise_kernels.cuh"
#include "cuda/sm90/api.hpp"
#include "cuda/sm90/backward_dq_convert.cuh"
#include "cuda/sm90/backward_kernel.cuh"
#include "cuda/sm90/backward_params.cuh"
#include "cuda/sm90/backward_traits.cuh"
#include "cuda/sm90/launch_support.cuh"
#include "cuda/sm90/trace.cuh"
#include "flashattn/error.hpp"

namespace flashattn::cuda::sm90 {

template <class Element, int HeadDim>
void run_backward(const detail::BackwardProblem& problem) {
  using namespace cute;
  using Traits = BackwardTraits<Element, HeadDim>;
  using Rows = sm80::RowwiseShape<HeadDim>;
  if (problem.batch == 0 || problem.heads_q == 0) return;
  if (problem.batch > 65535)  // the row passes' grids
    throw Error(ErrorKind::unsupported, "batch", "at most 65535 sequences on the sm90 backward",
                std::to_string(problem.batch));
  cudaStream_t stream = static_cast<cudaStream_t>(problem.stream);
  const auto [sms, l2_bytes] = device_facts(problem.device_index);
  const int sm_count = usable_sms(problem, sms);

  // The row pass's parameters (the sm80 family's layout of the per-row workspace). The row
  // statistics are read by TMA, whose per-head stride must be a multiple of 16 bytes.
  sm80::BackwardParams rows;
  rows.q = problem.q;
  rows.k = problem.k;
  rows.v = problem.v;
  rows.out = problem.out;
  rows.dout = problem.dout;
  rows.dq = problem.dq;
  rows.dk = problem.dk;
  rows.dv = problem.dv;
  rows.lse = problem.lse;
  rows.cu_seqlens_q = problem.cu_seqlens_q;
  rows.cu_seqlens_k = problem.cu_seqlens_k;
  rows.batch = problem.batch;
  rows.heads_q = problem.heads_q;
  rows.heads_kv = problem.heads_kv;
  rows.seqlen_q = problem.seqlen_q;
  rows.seqlen_k = problem.seqlen_k;
  rows.scale = problem.scale;
  rows.cols = {problem.head_dim, true};  // the sm90 backward runs at d == width, 16-byte aligned
  const std::int64_t dense_rows_q = std::int64_t(problem.batch) * problem.seqlen_q;
  rows.dense_rows_q = (dense_rows_q + 3) / 4 * 4;
  rows.dense_rows_k = std::int64_t(problem.batch) * problem.seqlen_k;

  const int n_blocks = (problem.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN;
  const bool masked = problem.window_left >= 0 || problem.window_right >= 0;
  const long long tiles_per_split = static_cast<long long>(n_blocks) * problem.heads_kv * problem.batch;
  rows.head_splits = masked ? sm80::choose_head_splits(problem.group_size(), tiles_per_split, sm_count)
                            : unmasked_head_splits(problem.group_size(), tiles_per_split, sm_count);
  const bool split_group = rows.head_splits > 1;

  DqAccumulatorLayout dq_layout;
  dq_layout.block_m = Traits::kBlockM;
  dq_layout.head_dim = HeadDim;
  dq_layout.blocks_per_head = dense_rows_q / Traits::kBlockM + problem.batch + 1;

  // Workspace, freed in stream order once the kernels below have run.
  WorkspacePlan plan;
  const std::size_t stats_count = std::size_t(problem.heads_q) * rows.dense_rows_q;
  const std::size_t lse_at = plan.add<float>(stats_count);
  const std::size_t delta_at = plan.add<float>(stats_count);
  const std::size_t dq_count = std::size_t(dq_layout.elements(problem.heads_q));
  const std::size_t dq_at = plan.add<float>(dq_count);
  const std::size_t semaphore_count =  // deterministic mode's dQ turn counters
      problem.deterministic ? std::size_t(problem.heads_q) * dq_layout.blocks_per_head : 0;
  const std::size_t semaphore_at = plan.add<int>(semaphore_count);
  const std::size_t counter_at = plan.add<int>(1);
  const std::size_t partial_count = std::size_t(rows.head_splits) * rows.dense_rows_k * problem.heads_kv * HeadDim;
  const std::size_t dk_partial_at = split_group ? plan.add<float>(partial_count) : 0;
  const std::size_t dv_partial_at = split_group ? plan.add<float>(partial_count) : 0;
#ifdef FLASHATTN_SM90_TRACE
  const std::size_t trace_count = std::size_t(sm_count) * kTraceWarpGroups * kTraceRecords;
  const std::size_t trace_at = plan.add<std::uint64_t>(trace_count);
#endif
  StreamWorkspace workspace(plan.bytes(), stream);
  rows.lse_log2 = workspace.at<float>(lse_at);
  rows.delta = workspace.at<float>(delta_at);
  if (split_group) {
    rows.dk_partial = workspace.at<float>(dk_partial_at);
    rows.dv_partial = workspace.at<float>(dv_partial_at);
  }
  float* dq_accum = workspace.at<float>(dq_at);
  rows.zero_fill = dq_accum;  // cleared by the preprocess below
  rows.zero_fill_elements = std::int64_t(dq_count);
  int* semaphore = problem.deterministic ? workspace.at<int>(semaphore_at) : nullptr;
  if (semaphore) FA_CUDA_CHECK(cudaMemsetAsync(semaphore, 0, semaphore_count * sizeof(int), stream));
  int* tile_counter = workspace.at<int>(counter_at);
  FA_CUDA_CHECK(cudaMemsetAsync(tile_counter, 0, sizeof(int), stream));

  const unsigned batch = unsigned(problem.batch);
  const dim3 row_grid((problem.seqlen_q + Rows::kRowsPerBlock - 1) / Rows::kRowsPerBlock, problem.heads_q, batch);
  if (row_grid.x > 0) {
    sm80::backward_preprocess_kernel<Element, HeadDim><<<row_grid, Rows::kThreads, 0, stream>>>(rows);
    FA_CUDA_CHECK_LAUNCH();
  }

  // The main kernel's parameters.
  BackwardParams<Traits> p{};
  auto q = tma_view<Traits, const Element>(problem, problem.q, true);
  auto dout = tma_view<Traits, const Element>(problem, problem.dout, true);
  auto k = tma_view<Traits, const Element>(problem, problem.k, false);
  auto v = tma_view<Traits, const Element>(problem, problem.v, false);
  auto stats_view = [&](const float* data) {
    return make_tensor(make_gmem_ptr(data),
                       make_layout(make_shape(int(std::max<std::int64_t>(dense_rows_q, 1)), problem.heads_q),
                                   make_stride(_1{}, rows.dense_rows_q)));
  };
  const Layout<Shape<Int<Traits::kStatRows>>> stats_smem;
  p.tma_q = make_tma_copy(SM90_TMA_LOAD{}, q, take<0, 2>(typename Traits::SmemLayoutQ{}),
                          Shape<Int<Traits::kBlockM>, Int<HeadDim>>{}, _1{});
  p.tma_dout = make_tma_copy(SM90_TMA_LOAD{}, dout, take<0, 2>(typename Traits::SmemLayoutdO{}),
                             Shape<Int<Traits::kBlockM>, Int<HeadDim>>{}, _1{});
  p.tma_k = make_tma_copy(SM90_TMA_LOAD{}, k, typename Traits::SmemLayoutK{}, Shape<Int<Traits::kBlockN>, Int<HeadDim>>{},
                          _1{});
  p.tma_v = make_tma_copy(SM90_TMA_LOAD{}, v, typename Traits::SmemLayoutV{}, Shape<Int<Traits::kBlockN>, Int<HeadDim>>{},
                          _1{});
  auto lse = stats_view(rows.lse_log2);
  auto delta = stats_view(rows.delta);
  p.tma_lse = make_tma_copy(SM90_TMA_LOAD{}, lse, stats_smem, Shape<Int<Traits::kStatRows>>{}, _1{});
  p.tma_delta = make_tma_copy(SM90_TMA_LOAD{}, delta, stats_smem, Shape<Int<Traits::kStatRows>>{}, _1{});
  p.shape_q = q.shape();
  p.shape_k = k.shape();
  p.shape_stats = lse.shape();

  p.dk = problem.dk;
  p.dv = problem.dv;
  p.cu_seqlens_q = problem.cu_seqlens_q;
  p.cu_seqlens_k = problem.cu_seqlens_k;
  p.seqlen_q = problem.seqlen_q;
  p.seqlen_k = problem.seqlen_k;
  p.heads_q = problem.heads_q;
  p.heads_kv = problem.heads_kv;
  p.window_left = problem.window_left;
  p.window_right = problem.window_right;
  constexpr float kLog2e = 1.4426950408889634f;
  p.scale = problem.scale;
  p.scale_log2 = problem.scale * kLog2e;
  p.softcap = problem.softcap > 0.f;
  p.softcap_inner = p.softcap ? problem.scale / problem.softcap : 0.f;
  p.softcap_outer_log2 = problem.softcap * kLog2e;
  p.dropout = problem.dropout;
  p.alibi = problem.alibi;
  p.head_splits = rows.head_splits;
  p.dk_partial = rows.dk_partial;
  p.dv_partial = rows.dv_partial;
  p.dense_rows_k = rows.dense_rows_k;
  p.dq_accum = dq_accum;
  p.dq_layout = dq_layout;
  p.dq_semaphore = semaphore;
  p.trace = nullptr;
#ifdef FLASHATTN_SM90_TRACE
  p.trace = workspace.at<std::uint64_t>(trace_at);
  FA_CUDA_CHECK(cudaMemsetAsync(p.trace, 0, trace_count * sizeof(std::uint64_t), stream));
#endif
  p.n_blocks = n_blocks;
  const long long tiles = tiles_per_split * rows.head_splits;
  if (tiles > 0x7fffffffLL)
    throw Error(ErrorKind::unsupported, "batch * heads_kv * seqlen_k", "fewer than 2^31 key blocks",
                std::to_string(tiles));
  p.num_tiles = int(tiles);
  p.claim_last_to_first = problem.deterministic;
  if (problem.deterministic) {
    const int heads_per_tile = problem.group_size() / rows.head_splits;
    const int steps_per_tile = (problem.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM * heads_per_tile;
    const long long column_bytes =
        (long long)problem.seqlen_q * heads_per_tile * HeadDim * (2 * sizeof(Element) + sizeof(float));
    p.claim_interleave =
        masked ? 1 : BackwardClaimOrder::deterministic_interleave(sm_count, steps_per_tile, column_bytes, l2_bytes);
  } else {
    const int columns = problem.heads_kv * rows.head_splits * problem.batch;
    p.claim_interleave = BackwardClaimOrder::default_interleave(masked, columns, tiles, sm_count);
  }
  p.tile_counter = tile_counter;
  const dim3 main_grid(unsigned(std::min<long long>(tiles, sm_count)));
  if (tiles > 0) {
    // Instances: (softcap, ALiBi), ALiBi's keeping their registers out of the others', and dropout
    // (without softcap: the dispatcher rejects the pair; with ALiBi it runs the sm80 backward);
    // at head dims 192 and 256 each again with the ordered dQ adds of deterministic mode, so that
    // the default kernels carry none of its code (a first design's turn code in them took ptxas
    // from 48 to 64-68 bytes of spill stores at d = 256).
    auto run_ordered = [&](auto softcap, auto dropout, auto alibi, auto ordered) {
      constexpr auto kernel = &backward_kernel<Traits, decltype(softcap)::value, decltype(dropout)::value,
                                               decltype(alibi)::value, decltype(ordered)::value>;
      allow_shared_memory<kernel>(Traits::kSmemBytes, problem.device_index);
      kernel<<<main_grid, Traits::kThreads, Traits::kSmemBytes, stream>>>(p);
    };
    auto run = [&](auto softcap, auto dropout, auto alibi) {
      if constexpr (Traits::kSplitHeadDim)
        if (problem.deterministic) return run_ordered(softcap, dropout, alibi, std::true_type{});
      run_ordered(softcap, dropout, alibi, std::false_type{});
    };
    using T = std::true_type;
    using F = std::false_type;
    if (problem.dropout.enabled()) run(F{}, T{}, F{});
    else if (p.alibi.enabled()) p.softcap ? run(T{}, F{}, T{}) : run(F{}, F{}, T{});
    else p.softcap ? run(T{}, F{}, F{}) : run(F{}, F{}, F{});
    FA_CUDA_CHECK_LAUNCH();
#ifdef FLASHATTN_SM90_TRACE
    write_trace("FLASHATTN_SM90_BACKWARD_TRACE_FILE", p.trace, trace_count, stream);
#endif
  }

  const auto& dq = problem.dq;
  const bool dq_vectors = reinterpret_cast<std::uintptr_t>(dq.data) % 16 == 0 && dq.batch_stride % 8 == 0 &&
                          dq.seq_stride % 8 == 0 && dq.head_stride % 8 == 0;
  DqConvertParams convert{dq_accum, dq_layout, dq, problem.cu_seqlens_q, problem.seqlen_q, problem.scale, dq_vectors};
  const dim3 convert_grid((problem.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM, problem.heads_q, batch);
  if (convert_grid.x > 0) {
    backward_dq_convert_kernel<Traits><<<convert_grid, Traits::kDqSlices * 128, 0, stream>>>(convert);
    FA_CUDA_CHECK_LAUNCH();
  }
  if (split_group) {
    const dim3 kv_grid((problem.seqlen_k + Rows::kRowsPerBlock - 1) / Rows::kRowsPerBlock, problem.heads_kv, batch);
    if (kv_grid.x > 0) {
      sm80::backward_kv_reduce_kernel<Element, HeadDim><<<kv_grid, Rows::kThreads, 0, stream>>>(rows);
      FA_CUDA_CHECK_LAUNCH();
    }
  }
}

}  // namespace flashattn::cuda::sm90
