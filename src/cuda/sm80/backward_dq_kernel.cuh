#pragma once
// dQ without atomics, for deterministic mode: one CTA per (query block, query head, sequence)
// walks the key blocks its rows see, recomputing S, dP, P and dS (as the main kernel does) and
// accumulating dQ += dS K in registers, in a fixed order. K and V are double-buffered.
#include <cute/tensor.hpp>

#include "cuda/common/fragment.cuh"
#include "cuda/common/mask.cuh"
#include "cuda/common/sequence_rows.cuh"
#include "cuda/sm80/backward_params.cuh"
#include "cuda/sm80/backward_scores.cuh"
#include "cuda/sm80/backward_tile_ops.cuh"
#include "cuda/sm80/backward_traits.cuh"

namespace flashattn::cuda::sm80 {

// kSoftcap, kColumns, kExtras: as in the main kernel (backward_dkdv_kernel.cuh).
template <class Traits, bool kSoftcap, ColumnMode kColumns = ColumnMode::full, bool kExtras = false>
__global__ void __launch_bounds__(Traits::kThreads)
    backward_dq_kernel(const __grid_constant__ BackwardParams p) {
  using namespace cute;
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kHeadDim = Traits::kHeadDim;
  using BlockM = Int<kBlockM>;
  using BlockN = Int<kBlockN>;
  using HeadDim = Int<kHeadDim>;

  const int tid = threadIdx.x;
  const int head = blockIdx.y, b = blockIdx.z;
  const int kv_head = head / p.group_size();
  const SequenceRows seq = sequence_rows(b, p.seqlen_q, p.seqlen_k, p.cu_seqlens_q, p.cu_seqlens_k);
  const int row0 = blockIdx.x * kBlockM;
  if (row0 >= seq.len_q) return;
  const int valid_rows = seq.len_q - row0;
  const int row_end = min(row0 + kBlockM, seq.len_q);

  // The key blocks these rows see.
  const BlockMask mask{seq.len_q, seq.len_k, p.window_left, p.window_right, row0, row_end - 1};
  const KeyTileRange tiles = mask.tiles(kBlockN);
  const int n_first = tiles.begin;
  const int n_count = tiles.empty() ? 0 : tiles.end - tiles.begin;

  auto row_tile = [&](const detail::SeqTensor& t, std::int64_t row, int h, auto tile_rows) {
    Element* base = static_cast<Element*>(t.data) + b * t.batch_stride + row * t.seq_stride +
                    std::int64_t(h) * t.head_stride;
    return make_tensor(make_gmem_ptr(base),
                       make_layout(make_shape(tile_rows, HeadDim{}), make_stride(t.seq_stride, _1{})));
  };

  extern __shared__ __align__(1024) char smem_raw[];
  auto& smem = *reinterpret_cast<typename Traits::SharedStorage*>(smem_raw);
  Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Traits::LayoutQ{});
  Tensor sdO = make_tensor(make_smem_ptr(smem.dout.data()), typename Traits::LayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Traits::LayoutKV{});     // (N, D, stage)
  Tensor sKt = make_tensor(make_smem_ptr(smem.k.data()), typename Traits::LayoutKVt{});   // (D, N, stage)
  Tensor sV = make_tensor(make_smem_ptr(smem.v.data()), typename Traits::LayoutKV{});

  typename Traits::GmemLoad gmem_load;
  auto load_thr = gmem_load.get_thread_slice(tid);
  Tensor load_coords_m = load_thr.partition_S(make_identity_tensor(Shape<BlockM, HeadDim>{}));
  Tensor load_coords_n = load_thr.partition_S(make_identity_tensor(Shape<BlockN, HeadDim>{}));
  // Key blocks after the first: its per-thread views shifted by a uniform offset.
  Tensor tKgK = load_thr.partition_S(row_tile(p.k, seq.row_k + n_first * kBlockN, kv_head, BlockN{}));
  Tensor tVgV = load_thr.partition_S(row_tile(p.v, seq.row_k + n_first * kBlockN, kv_head, BlockN{}));
  auto load_kv = [&](int n_block, int stage) {
    const int key0 = n_block * kBlockN;
    const std::int64_t rows = key0 - n_first * kBlockN;
    load_tile_async<kColumns>(gmem_load, make_tensor(tKgK.data() + rows * p.k.seq_stride, tKgK.layout()),
                    load_thr.partition_D(sK(_, _, stage)), load_coords_n, seq.len_k - key0, p.cols);
    load_tile_async<kColumns>(gmem_load, make_tensor(tVgV.data() + rows * p.v.seq_stride, tVgV.layout()),
                    load_thr.partition_D(sV(_, _, stage)), load_coords_n, seq.len_k - key0, p.cols);
  };

  typename Traits::Mma mma;
  auto thr_mma = mma.get_thread_slice(tid);
  auto ldsm_a = make_tiled_copy_A(LdsmAtom<Element>{}, mma);
  auto ldsm_b = make_tiled_copy_B(LdsmAtom<Element>{}, mma);
  auto ldsm_bt = make_tiled_copy_B(LdsmTransposedAtom<Element>{}, mma);
  Tensor tSsQ = ldsm_a.get_thread_slice(tid).partition_S(sQ);
  Tensor tdPsdO = ldsm_a.get_thread_slice(tid).partition_S(sdO);
  Tensor tSsK = ldsm_b.get_thread_slice(tid).partition_S(sK);     // (CPY, N, K, stage)
  Tensor tdPsV = ldsm_b.get_thread_slice(tid).partition_S(sV);
  Tensor tdQsKt = ldsm_bt.get_thread_slice(tid).partition_S(sKt);
  Tensor tSrQ = thr_mma.partition_fragment_A(sQ);
  Tensor tdPrdO = thr_mma.partition_fragment_A(sdO);
  Tensor tSrK = thr_mma.partition_fragment_B(sK(_, _, 0));
  Tensor tdPrV = thr_mma.partition_fragment_B(sV(_, _, 0));
  Tensor tdQrKt = thr_mma.partition_fragment_B(sKt(_, _, 0));

  Tensor s_coords = rowcol_view(thr_mma.partition_C(make_identity_tensor(Shape<BlockM, BlockN>{})));
  constexpr int kRows = decltype(size<0>(s_coords))::value;
  [[maybe_unused]] Tensor s_coords_acc = thr_mma.partition_C(make_identity_tensor(Shape<BlockM, BlockN>{}));
  [[maybe_unused]] DropoutStream dropout_rng;
  const bool alibi = kExtras && p.alibi.enabled(), dropout = kExtras && p.dropout.enabled();
  if (dropout) dropout_rng = DropoutStream::load(p.dropout, p.heads_q);
  float lse_log2[kRows], delta[kRows];
  const std::int64_t stats_offset = std::int64_t(head) * p.dense_rows_q + seq.dense_q + row0;
  load_row_stats(lse_log2, delta, s_coords, p.lse_log2 + stats_offset, p.delta + stats_offset, valid_rows);

  if (n_count > 0) {
    load_tile_async<kColumns>(gmem_load, load_thr.partition_S(row_tile(p.q, seq.row_q + row0, head, BlockM{})),
                    load_thr.partition_D(sQ), load_coords_m, valid_rows, p.cols);
    load_tile_async<kColumns>(gmem_load, load_thr.partition_S(row_tile(p.dout, seq.row_q + row0, head, BlockM{})),
                    load_thr.partition_D(sdO), load_coords_m, valid_rows, p.cols);
    load_kv(n_first, 0);
  }
  cp_async_fence();

  const ScoreTransform transform = ScoreTransform::make(p.scale, p.softcap);
  Tensor acc_dq = partition_fragment_C(mma, Shape<BlockM, HeadDim>{});
  clear(acc_dq);

  // One key block; kMasked: it needs element-wise masking (a branch per block, not predicates
  // per element: see the main kernel).
  auto run_block = [&](int i, auto masked) {
    constexpr bool kMasked = decltype(masked)::value;
    const int stage = i & 1;
    const int key0 = (n_first + i) * kBlockN;
    cp_async_wait<0>();
    __syncthreads();  // this block's K, V landed; every warp is done with the other stage
    if (i + 1 < n_count) load_kv(n_first + i + 1, stage ^ 1);
    cp_async_fence();

    Tensor acc_s = partition_fragment_C(mma, Shape<BlockM, BlockN>{});
    Tensor acc_dp = partition_fragment_C(mma, Shape<BlockM, BlockN>{});
    clear(acc_s);
    clear(acc_dp);
    gemm_smem(mma, acc_s, tSrQ, tSrK, tSsQ, tSsK(_, _, _, stage), ldsm_a, ldsm_b);
    gemm_smem(mma, acc_dp, tdPrdO, tdPrV, tdPsdO, tdPsV(_, _, _, stage), ldsm_a, ldsm_b);

    Tensor s_rc = rowcol_view(acc_s);
    Tensor dp_rc = rowcol_view(acc_dp);
    if (dropout)  // dS = P (dP z - D): z = keep / (1 - p) on dP; warps along rows only
      apply_dropout_scaled<kDropoutConsecutiveTiles<1>>(acc_dp, s_coords_acc, dropout_rng, b, head, row0, key0,
                                                        p.dropout.keep_scale);
    if (alibi)
      scores_to_gradients<kMasked, kSoftcap>(s_rc, dp_rc, s_coords, lse_log2, delta, transform, mask, key0,
                                             alibi_rows<kRows>(p.alibi, b, head, s_coords, row0, seq.len_q, seq.len_k));
    else
      scores_to_gradients<kMasked, kSoftcap>(s_rc, dp_rc, s_coords, lse_log2, delta, transform, mask, key0);

    Tensor ds = convert_fragment<Element>(acc_dp);
    gemm_reg_smem(mma, acc_dq, make_tensor(ds.data(), accumulator_as_a_operand_layout(ds.layout())), tdQrKt, tdQsKt(_, _, _, stage), ldsm_bt);
  };
  for (int i = 0; i < n_count; ++i) {
    if (!alibi && mask.tile_fully_visible(n_first + i, kBlockN))
      run_block(i, cute::false_type{});
    else
      run_block(i, cute::true_type{});
  }

  CUTE_UNROLL
  for (int i = 0; i < size(acc_dq); ++i) acc_dq(i) *= p.scale;
  Tensor dq_coords = rowcol_view(thr_mma.partition_C(make_identity_tensor(Shape<BlockM, HeadDim>{})));
  store_pairs<kColumns>(rowcol_view(acc_dq),
                        rowcol_view(thr_mma.partition_C(row_tile(p.dq, seq.row_q + row0, head, BlockM{}))), dq_coords,
                        valid_rows, p.cols);
}

}  // namespace flashattn::cuda::sm80
