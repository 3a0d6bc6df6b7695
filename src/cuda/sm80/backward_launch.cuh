#pragma once
// The sm80 backward's entry point: plans the workspace and enqueues the kernels on the
// problem's stream (nothing synchronizes):
//   1. preprocess: D = rowsum(dO * O), LSE * log2(e)        (backward_rowwise_kernels.cuh)
//   2. main kernel: dK, dV; dQ by fp32 atomics               (backward_dkdv_kernel.cuh)
//   3. dQ: accumulator -> dq, or in deterministic mode a separate atomic-free dQ kernel
//      (backward_dq_kernel.cuh)
//   4. GQA with a split group: fixed-order sum of the dK/dV partials
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "cuda/common/check.cuh"
#include "cuda/common/stream_workspace.cuh"
#include "cuda/sm80/api.hpp"
#include "cuda/sm80/backward_config.cuh"
#include "cuda/sm80/backward_dkdv_kernel.cuh"
#include "cuda/sm80/backward_dq_kernel.cuh"
#include "cuda/sm80/backward_params.cuh"
#include "cuda/sm80/backward_rowwise_kernels.cuh"
#include "cuda/sm80/backward_traits.cuh"
#include "flashattn/error.hpp"

namespace flashattn::cuda::sm80 {
namespace backward_detail {

inline int ceil_div(long long a, long long b) { return int((a + b - 1) / b); }

inline BackwardParams make_params(const detail::BackwardProblem& problem) {
  BackwardParams p;
  p.q = problem.q;
  p.k = problem.k;
  p.v = problem.v;
  p.out = problem.out;
  p.dout = problem.dout;
  p.dq = problem.dq;
  p.dk = problem.dk;
  p.dv = problem.dv;
  p.lse = problem.lse;
  p.cu_seqlens_q = problem.cu_seqlens_q;
  p.cu_seqlens_k = problem.cu_seqlens_k;
  p.batch = problem.batch;
  p.heads_q = problem.heads_q;
  p.heads_kv = problem.heads_kv;
  p.seqlen_q = problem.seqlen_q;
  p.seqlen_k = problem.seqlen_k;
  p.scale = problem.scale;
  p.softcap = problem.softcap;
  p.alibi = problem.alibi;
  p.window_left = problem.window_left;
  p.window_right = problem.window_right;
  p.dropout = problem.dropout;
  p.cols = head_columns(problem);
  p.dense_rows_q = std::int64_t(problem.batch) * problem.seqlen_q;
  p.dense_rows_k = std::int64_t(problem.batch) * problem.seqlen_k;
  return p;
}

// Launches `kernel` with `smem_bytes` of dynamic shared memory (raising the kernel's limit
// where it exceeds the default 48 KB).
// f(std::true_type{}) or f(std::false_type{}): a run-time flag as a compile-time one.
template <class F>
void with_flag(bool value, F&& f) {
  if (value) f(std::true_type{});
  else f(std::false_type{});
}

template <class Kernel>
void launch(Kernel kernel, dim3 grid, int threads, int smem_bytes, cudaStream_t stream,
            const BackwardParams& p) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;
  if (smem_bytes > 48 * 1024)
    FA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
  kernel<<<grid, threads, smem_bytes, stream>>>(p);
  FA_CUDA_CHECK_LAUNCH();
}

}  // namespace backward_detail

// The backward with given kernel traits (run_backward picks them; the smoke driver's tuning
// mode passes others).
template <class Main, class DqOnly>
void run_backward_with(const detail::BackwardProblem& problem) {
  using namespace backward_detail;
  using Element = typename Main::Element;
  constexpr int HeadDim = Main::kHeadDim;
  using Rows = RowwiseShape<HeadDim>;

  if (problem.batch == 0) return;
  if (problem.batch > 65535)
    throw Error(ErrorKind::unsupported, "batch", "at most 65535 sequences on the sm80 backward",
                std::to_string(problem.batch));
  cudaStream_t stream = static_cast<cudaStream_t>(problem.stream);
  int num_sms = 0, max_smem = 0;
  FA_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, problem.device_index));
  FA_CUDA_CHECK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, problem.device_index));
  const int smem_needed = Main::kSmemBytes > DqOnly::kSmemBytes ? Main::kSmemBytes : DqOnly::kSmemBytes;
  if (smem_needed > max_smem)
    throw Error(ErrorKind::unsupported, "head_dim",
                "a head dim whose sm80 backward tiles fit this GPU's shared memory (" +
                    std::to_string(max_smem) + " bytes per block; head dim " + std::to_string(HeadDim) +
                    " needs " + std::to_string(smem_needed) + ")",
                std::to_string(HeadDim));

  BackwardParams p = make_params(problem);
  const int n_blocks = ceil_div(problem.seqlen_k, Main::kBlockN);
  p.head_splits = choose_head_splits(problem.group_size(),
                                     static_cast<long long>(n_blocks) * problem.heads_kv * problem.batch, num_sms);

  // Workspace, freed in stream order once the kernels below have run.
  WorkspacePlan plan;
  const std::size_t stats_count = std::size_t(problem.heads_q) * p.dense_rows_q;
  const std::size_t lse_at = plan.add<float>(stats_count);
  const std::size_t delta_at = plan.add<float>(stats_count);
  p.dq_pad_rows = BackwardParams::dq_pad_rows_for(Main::kBlockM);
  const std::size_t dq_count = std::size_t(p.dq_accum_elements(HeadDim));
  const std::size_t dq_at = problem.deterministic ? 0 : plan.add<float>(dq_count);
  const std::size_t partial_count = std::size_t(p.head_splits) * p.dense_rows_k * problem.heads_kv * HeadDim;
  const bool split_group = p.head_splits > 1;
  const std::size_t dk_partial_at = split_group ? plan.add<float>(partial_count) : 0;
  const std::size_t dv_partial_at = split_group ? plan.add<float>(partial_count) : 0;
  StreamWorkspace workspace(plan.bytes(), stream);
  p.lse_log2 = workspace.at<float>(lse_at);
  p.delta = workspace.at<float>(delta_at);
  if (!problem.deterministic) {
    p.dq_accum = workspace.at<float>(dq_at);
    p.zero_fill = p.dq_accum;  // cleared by the preprocess below
    p.zero_fill_elements = std::int64_t(dq_count);
  }
  if (split_group) {
    p.dk_partial = workspace.at<float>(dk_partial_at);
    p.dv_partial = workspace.at<float>(dv_partial_at);
  }

  const unsigned batch = unsigned(problem.batch);
  const dim3 q_rows_grid(ceil_div(problem.seqlen_q, Rows::kRowsPerBlock), problem.heads_q, batch);
  launch(backward_preprocess_kernel<Element, HeadDim>, q_rows_grid, Rows::kThreads, 0, stream, p);
  const dim3 main_grid(n_blocks, problem.heads_kv * p.head_splits, batch);
  // The instances, which bound this file's build time: tile columns `full` at head dim HeadDim
  // with 16-byte aligned operands, else `any` (common/head_columns.cuh: whole vectors or element by
  // element, chosen per piece at run time); softcap and dQ by atomics as template flags; ALiBi
  // and dropout in one extras instance per softcap, with `any` columns, which serves both dQ modes
  // (backward_dkdv_kernel.cuh).
  const bool full_columns = column_mode(p.cols, HeadDim) == ColumnMode::full;
  const bool extras = problem.dropout.enabled() || p.alibi.enabled();
  const dim3 dq_grid(ceil_div(problem.seqlen_q, DqOnly::kBlockM), problem.heads_q, batch);
  with_flag(p.softcap > 0, [&](auto softcap) {
    constexpr bool kS = decltype(softcap)::value;
    auto main_kernel = [&](auto accumulate_dq, auto with_extras) {
      constexpr bool kAcc = decltype(accumulate_dq)::value, kX = decltype(with_extras)::value;
      if (full_columns && !kX)
        launch(backward_dkdv_kernel<Main, kS, kAcc, ColumnMode::full, kX>, main_grid, Main::kThreads,
               Main::kSmemBytes, stream, p);
      else
        launch(backward_dkdv_kernel<Main, kS, kAcc, ColumnMode::any, kX>, main_grid, Main::kThreads,
               Main::kSmemBytes, stream, p);
    };
    if (extras) main_kernel(std::true_type{}, std::true_type{});
    else with_flag(!problem.deterministic, [&](auto accumulate_dq) { main_kernel(accumulate_dq, std::false_type{}); });
    if (!problem.deterministic) return;
    with_flag(extras, [&](auto with_extras) {
      constexpr bool kX = decltype(with_extras)::value;
      if (full_columns && !kX)
        launch(backward_dq_kernel<DqOnly, kS, ColumnMode::full, kX>, dq_grid, DqOnly::kThreads, DqOnly::kSmemBytes,
               stream, p);
      else
        launch(backward_dq_kernel<DqOnly, kS, ColumnMode::any, kX>, dq_grid, DqOnly::kThreads, DqOnly::kSmemBytes,
               stream, p);
    });
  });
  if (!problem.deterministic)
    launch(backward_dq_convert_kernel<Element, HeadDim>, q_rows_grid, Rows::kThreads, 0, stream, p);
  if (split_group)
    launch(backward_kv_reduce_kernel<Element, HeadDim>,
           dim3(ceil_div(problem.seqlen_k, Rows::kRowsPerBlock), problem.heads_kv, batch), Rows::kThreads, 0,
           stream, p);
}

template <class Element, int HeadDim>
void run_backward(const detail::BackwardProblem& problem) {
  using Default = DkDvTraits<Element, HeadDim>;
  using LowSmemTiles = typename LowSharedMemoryTiles<HeadDim>::type;
  if constexpr (!std::is_same_v<LowSmemTiles, BackwardTiles<HeadDim>>) {
    int max_smem = 0;
    FA_CUDA_CHECK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, problem.device_index));
    if (Default::kSmemBytes > max_smem)
      return run_backward_with<DkDvTraits<Element, HeadDim, LowSmemTiles>, DqTraits<Element, HeadDim>>(problem);
  }
  run_backward_with<Default, DqTraits<Element, HeadDim>>(problem);
}

}  // namespace flashattn::cuda::sm80
