#pragma once
// Host side of the sm80 forward: flattens the problem into kernel parameters, picks tiles,
// packing and splits (forward_heuristics.hpp), and launches on the problem's stream without
// synchronizing. Split-KV partials live in a stream-ordered workspace (common/stream_workspace.cuh:
// allocated and freed on the problem's stream).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <type_traits>
#include <string>

#include "cuda/common/check.cuh"
#include "cuda/common/programmatic_launch.cuh"
#include "cuda/common/stream_workspace.cuh"
#include "cuda/sm80/api.hpp"
#include "cuda/sm80/forward_heuristics.hpp"
#include "cuda/sm80/forward_kernel.cuh"
#include "cuda/sm80/forward_params.hpp"
#include "cuda/sm80/forward_traits.cuh"
#include "cuda/sm80/split_kv_combine.cuh"
#include "flashattn/error.hpp"

namespace flashattn::cuda::sm80 {

inline ForwardParams make_forward_params(const detail::ForwardProblem& p) {
  ForwardParams f{};
  f.q = p.q.data;
  f.k = p.k.data;
  f.v = p.v.data;
  f.out = p.out.data;
  f.lse = p.lse.data;
  f.q_layout = p.q;
  f.k_layout = p.k;
  f.v_layout = p.v;
  f.out_layout = p.out;
  f.lse_layout = p.lse;
  f.cu_seqlens_q = p.cu_seqlens_q;
  f.cu_seqlens_k = p.cu_seqlens_k;
  f.kv = p.kv;
  if (p.kv.paged()) f.page_div = cutlass::FastDivmod(p.kv.pages.page_size);
  f.batch = p.batch;
  f.heads_q = p.heads_q;
  f.heads_kv = p.heads_kv;
  f.group = p.group_size();
  f.seqlen_q = p.seqlen_q;
  f.seqlen_k = p.seqlen_k;
  f.window_left = p.window_left;
  f.window_right = p.window_right;
  f.cols = head_columns(p);

  constexpr float kLog2e = 1.4426950408889634f;
  if (p.softcap > 0.f) {
    // logit = tanh(scale * q.k / softcap) in [-1, 1]; score = softcap * logit.
    f.softcap_input = p.scale / p.softcap;
    f.logit_scale = p.softcap;
  } else {
    // logit = sign(scale) * q.k, so that the running max is taken over what the softmax sees;
    // a zero scale gets a tiny positive one (all probabilities equal, masked keys still 0).
    f.negate_scores = p.scale < 0.f;
    f.logit_scale = std::fabs(p.scale);
  }
  f.scale_log2 = f.logit_scale > 0.f ? f.logit_scale * kLog2e : 1e-30f;
  f.alibi = p.alibi;  // validation keeps logit_scale > 0 with ALiBi
  f.alibi_to_logit = kLog2e / f.scale_log2;
  f.pack = 1;
  f.num_splits = 1;
  f.dropout = p.dropout;
  f.fused_append = p.fused_append;
  return f;
}

// What the launch needs to know about a kernel on a device, found once per (kernel, device):
// its shared-memory limit is raised there, and its residency read. Per-call queries would sit
// between the caller and the GPU, which matters for microsecond-scale decoding steps.
struct KernelResidency {
  int sm_count = 0;
  int ctas_per_sm = 0;
  int ctas_per_sm_paged = 0;  // launched with the paged K/V's page slots (sm80/paged_tiles.cuh)
  int l2_bytes = 0;
  // Launched programmatically (common/programmatic_launch.cuh): the kernel and the split-KV
  // combine, where their code waits for the previous grid (sm_90 and later).
  bool programmatic = false;
  bool combine_programmatic = false;
};

// Dynamic shared memory of a launch: the tiles, and the page slots when K/V are paged.
template <class Traits>
constexpr int forward_smem_bytes(bool paged) {
  return Traits::kSmemBytes + (paged ? TilePages<Traits::kBlockN>::kSmemBytes : 0);
}

template <class Traits, ColumnMode kColumns = ColumnMode::full, bool kDropout = false, bool kFusedAppend = false>
KernelResidency prepare_forward_kernel(int device) {
  auto query = [device] {
    KernelResidency r;
    constexpr int kMaxSmem = forward_smem_bytes<Traits>(true);
    if (kMaxSmem > 48 * 1024)
      FA_CUDA_CHECK(cudaFuncSetAttribute(forward_kernel<Traits, kColumns, kDropout, kFusedAppend>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         kMaxSmem));
    FA_CUDA_CHECK(cudaDeviceGetAttribute(&r.sm_count, cudaDevAttrMultiProcessorCount, device));
    FA_CUDA_CHECK(cudaDeviceGetAttribute(&r.l2_bytes, cudaDevAttrL2CacheSize, device));
    r.programmatic = compiled_with_grid_wait(forward_kernel<Traits, kColumns, kDropout, kFusedAppend>);
    r.combine_programmatic =
        compiled_with_grid_wait(combine_splits_kernel<typename Traits::Element, Traits::kHeadDim>);
    FA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&r.ctas_per_sm, forward_kernel<Traits, kColumns, kDropout, kFusedAppend>,
                                                                Traits::kThreads, Traits::kSmemBytes));
    FA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&r.ctas_per_sm_paged, forward_kernel<Traits, kColumns, kDropout, kFusedAppend>,
                                                                Traits::kThreads, kMaxSmem));
    return r;
  };
  constexpr int kMaxDevices = 64;
  static std::once_flag once[kMaxDevices];
  static KernelResidency cached[kMaxDevices];
  if (device < 0 || device >= kMaxDevices) return query();
  std::call_once(once[device], [&] { cached[device] = query(); });  // retried if it throws
  return cached[device];
}

inline void check_grid(const char* what, long long value, long long limit) {
  if (value > limit)
    throw Error(ErrorKind::unsupported, what,
                "at most " + std::to_string(limit) + " on the sm80 forward's grid",
                std::to_string(value));
}

// Launches one tile configuration. num_splits = 0 lets the heuristic choose (tuning tools force
// a count). kColumns: how the kernel moves tile columns (column_mode of params.cols;
// common/head_columns.cuh). kDropout: the kernel with dropout (params.pack must be 1).
// kFusedAppend: the kernel that does params.fused_append (sm80/fused_append.cuh).
template <class Traits, ColumnMode kColumns = ColumnMode::full, bool kDropout = false, bool kFusedAppend = false>
void launch_forward(const detail::ForwardProblem& problem, ForwardParams params, int device,
                    int num_splits = 0) {
  using Element = typename Traits::Element;
  constexpr int kHeadDim = Traits::kHeadDim;
  cudaStream_t stream = static_cast<cudaStream_t>(problem.stream);
  const KernelResidency residency = prepare_forward_kernel<Traits, kColumns, kDropout, kFusedAppend>(device);

  const long long rows = static_cast<long long>(problem.seqlen_q) * params.pack;
  const int m_blocks = int((rows + Traits::kBlockM - 1) / Traits::kBlockM);
  const int head_blocks = params.pack == 1 ? problem.heads_q : problem.heads_kv;
  const long long ctas = static_cast<long long>(m_blocks) * head_blocks * problem.batch;
  const TileShape tiles{Traits::kBlockM, Traits::kBlockN, Traits::kWarps};
  const int key_tiles = (visited_keys(problem, params.pack, tiles) + Traits::kBlockN - 1) / Traits::kBlockN;
  const bool paged = params.kv.paged();
  const int smem_bytes = forward_smem_bytes<Traits>(paged);
  const int slots = residency.sm_count * std::max(paged ? residency.ctas_per_sm_paged : residency.ctas_per_sm, 1);
  params.num_splits = num_splits > 0 ? std::min(num_splits, std::max(key_tiles, 1))
                                     : choose_num_splits(ctas, key_tiles, slots);
  if (static_cast<long long>(problem.batch) * params.num_splits > 65535) params.num_splits = 1;

  check_grid("heads", head_blocks, 65535);
  check_grid("batch", problem.batch, 65535);
  dim3 grid(m_blocks, head_blocks, problem.batch * params.num_splits);
  // Under a mask the query blocks differ in length: a 1D grid in longest-first order keeps the
  // last CTAs to start short (common/tile_order.cuh; docs/log/sm80-forward.md, 2026-11-25).
  params.order = {};
  if (problem.is_local() && params.num_splits == 1) {
    check_grid("batch * heads * query blocks", ctas, 0x7fffffffLL);
    const long long kv_bytes = TileOrder::kv_bytes_per_head(problem.seqlen_k, kHeadDim, int(sizeof(Element)),
                                                            params.pack == 1 ? problem.group_size() : 1);
    params.order = TileOrder::make(m_blocks, head_blocks, problem.batch, kv_bytes, residency.l2_bytes, true, slots);
    grid = dim3(unsigned(ctas));
  }

  // Split-KV partials: fp32 outputs and LSEs of every split, merged by the combine kernel.
  const size_t rows_per_split = size_t(problem.batch) * problem.heads_q * problem.seqlen_q;
  WorkspacePlan plan;
  size_t out_offset = 0, lse_offset = 0;
  if (params.num_splits > 1) {
    out_offset = plan.add<float>(size_t(params.num_splits) * rows_per_split * kHeadDim);
    lse_offset = plan.add<float>(size_t(params.num_splits) * rows_per_split);
  }
  StreamWorkspace workspace(plan.bytes(), stream);
  if (params.num_splits > 1) {
    params.partial_out = workspace.at<float>(out_offset);
    params.partial_lse = workspace.at<float>(lse_offset);
  }

  launch_programmatic(forward_kernel<Traits, kColumns, kDropout, kFusedAppend>, grid, dim3(Traits::kThreads), smem_bytes, stream,
                      residency.programmatic, params);

  if (params.num_splits > 1) {
    using Combine = CombineShape<kHeadDim>;
    const long long combine_ctas = (static_cast<long long>(rows_per_split) + Combine::kRowsPerCta - 1) /
                                   Combine::kRowsPerCta;
    check_grid("batch * heads_q * seqlen_q", combine_ctas, 0x7fffffffLL);
    launch_programmatic(combine_splits_kernel<Element, kHeadDim>, dim3(unsigned(combine_ctas)), dim3(Combine::kThreads),
                        0, stream, residency.combine_programmatic, params);
  }
}

template <class Element, int HeadDim>
void run_forward(const detail::ForwardProblem& problem) {
  if (problem.batch == 0 || problem.seqlen_q == 0) return;
  constexpr TileShape kPrefill = prefill_tiles(HeadDim);
  constexpr TileShape kDecode = decode_tiles(HeadDim);
  using PrefillTraits = ForwardTraits<Element, HeadDim, kPrefill.block_m, kPrefill.block_n, kPrefill.warps>;
  using DecodeTraits = ForwardTraits<Element, HeadDim, kDecode.block_m, kDecode.block_n, kDecode.warps>;

  ForwardParams params = make_forward_params(problem);
  // Dropout: one extra kernel, prefill tiles, query heads never packed into rows
  // (forward_heuristics.hpp: choose_tiles).
  const bool dropout = problem.dropout.enabled();
  const TileChoice tiles = choose_tiles(problem, HeadDim);
  params.pack = tiles.pack;
  // The dispatcher fuses a KV-cache append only where fuses_kv_append holds, which takes the
  // decode tiles.
  const bool fused_append = problem.fused_append.appends() || problem.fused_append.rotates();
  if (fused_append && !tiles.decode)
    throw Error(ErrorKind::unsupported, "k", "a KV-cache append fused on the decode tiles only",
                "a call on the prefill tiles");
  // Tiles are chosen by the width (the work per tile is the width's, whatever the head dim).
  auto launch = [&](auto columns) {
    constexpr ColumnMode kColumns = decltype(columns)::value;
    if (dropout)  // one instance: `any` columns serve every head dim
      launch_forward<PrefillTraits, ColumnMode::any, true>(problem, params, problem.device_index, problem.num_splits);
    else if (fused_append)
      launch_forward<DecodeTraits, kColumns, false, true>(problem, params, problem.device_index, problem.num_splits);
    else if (tiles.decode)
      launch_forward<DecodeTraits, kColumns>(problem, params, problem.device_index, problem.num_splits);
    else
      launch_forward<PrefillTraits, kColumns>(problem, params, problem.device_index, problem.num_splits);
  };
  // Two column instances: `full`, and `any` (vectors or elements per piece at run time) for head
  // dims below the width, so that dropout and the tile heights do not multiply three ways.
  if (column_mode(params.cols, HeadDim) == ColumnMode::full)
    launch(std::integral_constant<ColumnMode, ColumnMode::full>{});
  else
    launch(std::integral_constant<ColumnMode, ColumnMode::any>{});
}

}  // namespace flashattn::cuda::sm80
