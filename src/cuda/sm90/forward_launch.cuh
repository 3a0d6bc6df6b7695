#pragma once
// Host side of the sm90 forward: TMA descriptors from the problem's strides, kernel
// parameters, and a persistent launch on the problem's stream (no synchronization).
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <type_traits>
#include <vector>

#include <cute/tensor.hpp>

#include "cuda/common/check.cuh"
#include "cuda/common/online_softmax_deferred.cuh"
#include "cuda/common/stream_workspace.cuh"
#include "cuda/sm90/api.hpp"
#include "cuda/sm90/forward_heuristics.hpp"
#include "cuda/sm90/forward_kernel.cuh"
#include "cuda/sm90/forward_params.cuh"
#include "cuda/sm90/forward_traits.cuh"
#include "cuda/sm90/fp8_value_transpose.cuh"
#include "cuda/sm90/launch_support.cuh"
#include "cuda/sm90/trace.cuh"
#include "flashattn/error.hpp"

namespace flashattn::cuda::sm90 {

// The softmax variants (FlashAttention-4's options, see common/online_softmax_deferred.cuh).
// kSoftmaxDefault is what the library runs; builds with FLASHATTN_SM90_SOFTMAX_EXPERIMENT
// also contain the others, chosen by FLASHATTN_SM90_SOFTMAX=0..3 (bit 0: cubic exp2 for every
// 4th probability; bit 1: lazy rescale), to measure them side by side.
#ifndef FLASHATTN_SM90_SOFTMAX_DEFAULT
#define FLASHATTN_SM90_SOFTMAX_DEFAULT 0
#endif
constexpr int kSoftmaxDefault = FLASHATTN_SM90_SOFTMAX_DEFAULT;
template <int kVariant>
using ForwardSoftmax = DeferredOnlineSoftmax<2, (kVariant & 1) ? 4 : 0, (kVariant & 2) != 0>;
// FP8: P scaled by 2^8 before it is rounded to e4m3 (at most 256 < 448), which keeps its small
// entries out of e4m3's subnormals (docs/kernels/fp8-forward.md).
template <int kVariant>
using Fp8ForwardSoftmax = DeferredOnlineSoftmax<2, (kVariant & 1) ? 4 : 0, (kVariant & 2) != 0, 8>;

template <class Traits>
ForwardParams<Traits> make_forward_params(const detail::ForwardProblem& p, int sm_count, int l2_bytes) {
  using namespace cute;
  using Element = typename Traits::Element;
  constexpr float kLog2e = 1.4426950408889634f;
  ForwardParams<Traits> f{};

  const bool varlen = p.is_varlen();
  const bool paged = p.kv.paged();
  // Paged K/V: the whole-block copies are built over the pools too, (row in page, head dim,
  // heads_kv, page), as are the page-box copies (forward_paged_kv.cuh).
  auto key_side = [&](const detail::SeqTensor& t) {
    return paged ? paged_kv_view<Traits, const Element>(p, t) : tma_view<Traits, const Element>(p, t, false);
  };
  auto q = tma_view<Traits, const Element>(p, p.q, true);
  auto k = key_side(p.k);
  auto o = tma_view<Traits, typename Traits::OutputElement>(p, p.out, true);
  f.tma_q = make_tma_copy(SM90_TMA_LOAD{}, q, take<0, 2>(typename Traits::SmemLayoutQ{}),
                          Shape<Int<Traits::kBlockM>, Int<Traits::kHeadDim>>{}, _1{});
  f.tma_k = make_tma_copy(SM90_TMA_LOAD{}, k, take<0, 2>(typename Traits::SmemLayoutK{}),
                          Shape<Int<Traits::kBlockN>, Int<Traits::kHeadDim>>{}, _1{});
  using PageBox = typename Traits::PageBox;
  f.tma_k_page = make_tma_copy(SM90_TMA_LOAD{}, k,
                               typename Traits::template PageBoxLayout<typename Traits::SmemLayoutK>{}, PageBox{}, _1{});
  f.shape_kv_page = k.shape();
  if constexpr (!Traits::kFp8 || Traits::kTransposeValue) {  // V itself (the pre-pass's V^T: set_transposed_value)
    auto v = key_side(p.v);
    f.tma_v = make_tma_copy(SM90_TMA_LOAD{}, v, take<0, 2>(typename Traits::SmemLayoutV{}),
                            typename Traits::ValueBox{}, _1{});
    f.shape_v = v.shape();
  }
  if constexpr (Traits::kPagedKv) {
    f.page_maps = make_page_box_maps<Traits>(p);
    f.value_box_pages = std::min(paged_value_box_pages(Traits::kHeadDim), Traits::kBlockN / Traits::kPageRows);
  }
  f.kv = p.kv;
  f.v = p.v.data;
  f.v_page_stride = p.v.batch_stride;
  f.v_row_stride = p.v.seq_stride;
  f.v_head_stride = p.v.head_stride;
  f.tma_o = make_tma_copy(SM90_TMA_STORE{}, o, typename Traits::SmemLayoutO{},
                          Shape<Int<Traits::kRowsPerWarpGroup>, Int<Traits::kHeadDim>>{}, _1{});
  f.shape_q = q.shape();
  f.shape_k = k.shape();
  f.shape_o = o.shape();

  f.out = p.out.data;
  f.out_batch_stride = p.out.batch_stride;
  f.out_seq_stride = p.out.seq_stride;
  f.out_head_stride = p.out.head_stride;
  f.head_dim = p.head_dim;
  f.lse = p.lse.data;
  f.lse_batch_stride = p.lse.batch_stride;
  f.lse_head_stride = p.lse.head_stride;

  f.cu_seqlens_q = p.cu_seqlens_q;
  f.cu_seqlens_k = p.cu_seqlens_k;
  f.seqlen_q = p.seqlen_q;
  f.seqlen_k = p.seqlen_k;
  f.group = p.group_size();
  f.window_left = p.window_left;
  f.window_right = p.window_right;
  f.heads_q = p.heads_q;
  f.dropout = p.dropout;

  if (p.softcap > 0.f) {
    f.transform = ScoreTransform::softcap;
    f.softcap_input = p.scale / p.softcap;
    f.logit_scale = p.softcap;
  } else {
    f.transform = p.scale < 0.f ? ScoreTransform::negate : ScoreTransform::none;
    f.logit_scale = std::fabs(p.scale);
  }
  // A zero scale makes every visible key equally likely; a tiny positive one keeps the max
  // arithmetic (and masked keys at exactly 0) intact.
  f.scale_log2 = f.logit_scale > 0.f ? f.logit_scale * kLog2e : 1e-30f;
  f.alibi = p.alibi;  // validation keeps logit_scale > 0 with ALiBi
  f.alibi_to_logit = kLog2e / f.scale_log2;
  f.q_descale = p.q_descale;
  f.k_descale = p.k_descale;
  f.v_descale = p.v_descale;

  const int m_blocks = (p.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM;
  const long long kv_bytes =
      TileOrder::kv_bytes_per_head(p.seqlen_k, Traits::kHeadDim, int(sizeof(Element)), p.group_size());
  f.order = TileOrder::make(m_blocks, p.heads_q, p.batch, kv_bytes, l2_bytes, p.is_local(), sm_count);
  // The tail split needs every tile the same length (no mask, fixed length); not with dropout,
  // whose 1 / (1 - p) the merge of a split tile's segments would have to carry.
  // Nor with per-sequence key ranges (p.kv), whose tiles differ in length.
  const bool even_tiles = !p.is_local() && !varlen && Traits::kTailSplit && !p.dropout.enabled() && !p.kv.any();
  const int key_blocks = (p.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN;
  const long long tiles = (long long)m_blocks * p.heads_q * p.batch;
  f.tail = TailSplit::make(tiles, int(std::min<long long>(tiles, sm_count)), key_blocks, even_tiles);
  return f;
}

// FP8: the TMA load of V reads V^T (fp8_value_transpose.cuh) at vt: (head dim, keys, heads_kv,
// batch), keys contiguous (one packed axis for variable length).
template <class Traits>
void set_transposed_value(ForwardParams<Traits>& f, const detail::ForwardProblem& p, const void* vt) {
  using namespace cute;
  const bool varlen = p.is_varlen();
  const std::int64_t keys = transposed_value_row_keys(p);
  const int batch = varlen ? 1 : p.batch;
  auto layout = make_layout(make_shape(int(p.head_dim), int(std::max<std::int64_t>(keys, 1)), p.heads_kv, std::max(batch, 1)),
                            make_stride(keys, _1{}, keys * p.head_dim, keys * p.head_dim * p.heads_kv));
  auto vt_tensor = make_tensor(make_gmem_ptr(static_cast<typename Traits::Element const*>(vt ? vt : p.q.data)), layout);
  f.tma_v = make_tma_copy(SM90_TMA_LOAD{}, vt_tensor, take<0, 2>(typename Traits::SmemLayoutV{}),
                          typename Traits::ValueBox{}, _1{});
  f.shape_v = vt_tensor.shape();
}

template <class Traits, class Softmax, bool kDropout = false, bool kKeyBlockScales = false>
void launch_kernel(const detail::ForwardProblem& p, int sm_count, int l2_bytes) {
  ForwardParams<Traits> params = make_forward_params<Traits>(p, sm_count, l2_bytes);
  const long long tiles = (long long)params.order.num_m_blocks * p.heads_q * p.batch;
  if (tiles <= 0) return;
  if (tiles > 0x7fffffffLL - sm_count)
    throw Error(ErrorKind::unsupported, "batch * heads_q * seqlen_q", "fewer than 2^31 query tiles",
                std::to_string(tiles));
  constexpr auto kernel = &forward_kernel<Traits, Softmax, kDropout, kKeyBlockScales>;
  allow_shared_memory<kernel>(Traits::kSmemBytes, p.device_index);
  cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  const int grid = int(std::min<long long>(tiles, sm_count));
  // The tile counter lives in stream-ordered workspace (the library's pool, which keeps its
  // memory across synchronizations): zeroed, used and freed in stream order, so concurrent
  // calls on other streams have their own.
  // The tail split's arrival counters follow the tile counter, so one memset zeroes both.
  WorkspacePlan plan;
  const TailSplit& tail = params.tail;
  const int counters = 1 + tail.tiles() * Traits::kConsumerWarpGroups;
  const size_t counter_offset = plan.add<int>(counters);
  const size_t partial_offset = plan.add<float2>(
      size_t(tail.num_slots()) * Traits::kConsumerWarpGroups * 128 * partial_chunks<Traits::kHeadDim>());
  constexpr bool kPrePass = Traits::kFp8 && !Traits::kTransposeValue;
  const size_t vt_bytes = kPrePass ? transposed_value_bytes(p) : 0;
  const size_t vt_offset = plan.add<uint4>((vt_bytes + 15) / 16);
#ifdef FLASHATTN_SM90_TRACE
  const size_t trace_count = size_t(grid) * kTraceWarpGroups * kTraceRecords;
  const size_t trace_offset = plan.add<std::uint64_t>(trace_count);
#endif
  StreamWorkspace workspace(plan.bytes(), stream);
  params.tile_counter = workspace.at<int>(counter_offset);
  params.tail_arrivals = params.tile_counter + 1;
  params.partials = workspace.at<float2>(partial_offset);
  FA_CUDA_CHECK(cudaMemsetAsync(params.tile_counter, 0, counters * sizeof(int), stream));
  if constexpr (kPrePass) {
    void* vt = workspace.at<uint4>(vt_offset);
    transpose_value(p, vt, stream);
    set_transposed_value(params, p, vt);
  }
#ifdef FLASHATTN_SM90_TRACE
  params.trace = workspace.at<std::uint64_t>(trace_offset);
  FA_CUDA_CHECK(cudaMemsetAsync(params.trace, 0, trace_count * sizeof(std::uint64_t), stream));
#endif
  kernel<<<grid, Traits::kThreads, Traits::kSmemBytes, stream>>>(params);
  FA_CUDA_CHECK(cudaGetLastError());
#ifdef FLASHATTN_SM90_TRACE
  write_trace("FLASHATTN_SM90_TRACE_FILE", params.trace, trace_count, stream);
#endif
}

// The softmax variant (Softmax<kVariant>): the default, or (experiment builds) the one
// FLASHATTN_SM90_SOFTMAX names.
template <class Traits, template <int> class Softmax>
void launch_softmax_variant(const detail::ForwardProblem& p, int sm_count, int l2_bytes) {
#ifdef FLASHATTN_SM90_SOFTMAX_EXPERIMENT
  const char* env = std::getenv("FLASHATTN_SM90_SOFTMAX");
  switch (env ? std::atoi(env) : kSoftmaxDefault) {
    case 1: return launch_kernel<Traits, Softmax<1>>(p, sm_count, l2_bytes);
    case 2: return launch_kernel<Traits, Softmax<2>>(p, sm_count, l2_bytes);
    case 3: return launch_kernel<Traits, Softmax<3>>(p, sm_count, l2_bytes);
    default: return launch_kernel<Traits, Softmax<0>>(p, sm_count, l2_bytes);
  }
#else
  launch_kernel<Traits, Softmax<kSoftmaxDefault>>(p, sm_count, l2_bytes);
#endif
}

template <class Traits>
void launch_forward(const detail::ForwardProblem& p, int sm_count, int l2_bytes) {
  if constexpr (Traits::kFp8) {  // no dropout (validation)
    // V^T written in the kernel where few query rows read each KV head's V (forward_heuristics.hpp)
    // and the transposer's addresses hold for the stages (fp8_value_transposer.cuh).
    if constexpr (!Traits::kTransposeValue && transposer_addresses_hold<typename Traits::TransposingValue>()) {
      if (fp8_transposes_value_in_kernel(Traits::kHeadDim, p.seqlen_q, p.group_size()))
        return launch_forward<typename Traits::TransposingValue>(p, sm_count, l2_bytes);
    }
    // Block quantization: one more kernel per (head dim, output type), with the default softmax.
    if (p.k_descale.blocked())
      return launch_kernel<Traits, Fp8ForwardSoftmax<kSoftmaxDefault>, false, true>(p, sm_count, l2_bytes);
    launch_softmax_variant<Traits, Fp8ForwardSoftmax>(p, sm_count, l2_bytes);
  } else {
    // Paged K/V and dropout: one more kernel each per (dtype, head dim, tile height), with the
    // default softmax; dropout on 128-row tiles only (query_block_rows); not the two together
    // (api.hpp: supports_kv).
    if (p.kv.paged()) return launch_kernel<typename Traits::Paged, ForwardSoftmax<kSoftmaxDefault>>(p, sm_count, l2_bytes);
    if (p.dropout.enabled()) {
      if constexpr (Traits::kConsumerWarpGroups == 2)
        return launch_kernel<Traits, ForwardSoftmax<kSoftmaxDefault>, true>(p, sm_count, l2_bytes);
      else
        throw Error(ErrorKind::runtime, "dropout_p", "dropout on 128-row tiles (query_block_rows picks them)",
                    "a 192-row tile");
    }
    launch_softmax_variant<Traits, ForwardSoftmax>(p, sm_count, l2_bytes);
  }
}

template <class Element, int HeadDim>
void run_forward(const detail::ForwardProblem& p) {
  if (p.batch == 0 || p.seqlen_q == 0 || p.heads_q == 0) return;
  const auto [sms, l2] = device_facts(p.device_index);
  const int sm_count = usable_sms(p, sms), l2_bytes = l2;  // (a lambda captures no structured binding in C++17)
  // The kernel of a tile height; for e4m3 inputs the output's dtype picks it too.
  auto launch = [&](auto rows) {
    constexpr int kRows = decltype(rows)::value;
    if constexpr (sizeof(Element) == 1) {
      if (p.out_dtype == DType::bf16)
        return launch_forward<ForwardTraits<Element, HeadDim, kRows, cutlass::bfloat16_t>>(p, sm_count, l2_bytes);
      return launch_forward<ForwardTraits<Element, HeadDim, kRows, cutlass::half_t>>(p, sm_count, l2_bytes);
    } else {
      return launch_forward<ForwardTraits<Element, HeadDim, kRows>>(p, sm_count, l2_bytes);
    }
  };
  // 192 rows (three consumer warpgroups) where they take fewer waves: up to head dim 64, and up to
  // 128 for FP8 (its serial mainloop).
  if constexpr (tall_tiles_fit(HeadDim, sizeof(Element) == 1)) {
    if (query_block_rows(HeadDim, p.seqlen_q, (long long)p.heads_q * p.batch, sm_count, p.dropout.enabled(),
                         sizeof(Element) == 1) == 192)
      return launch(std::integral_constant<int, 192>{});
  }
  launch(std::integral_constant<int, 128>{});
}

}  // namespace flashattn::cuda::sm90
