#pragma once
// The main backward kernel (FlashAttention-2): one CTA per (key block, KV head [, query-head
// chunk], sequence). It loads its K and V block once, then walks the query blocks that can see
// it, for each query head of its chunk:
//   S = Q K^T, dP = dO V^T            (registers)
//   P, dS from S, dP, LSE and D       (backward_scores.cuh), stored to shared memory
//                                     (dropout: dS = P (dP z - D) and P z stored instead of P,
//                                      z = keep / (1 - p), common/dropout.cuh)
//   dV += P^T dO, dK += dS^T Q        (registers, for the whole walk)
//   dQ += dS K                        (fp32 atomics into the workspace; skipped in
//                                      deterministic mode, where backward_dq_kernel.cuh runs)
// Q is double-buffered: the next block's Q loads during this block's math, dO once the dV
// GEMM is done with it. At the end dK (scaled) and dV are written, or fp32 partials when the
// query heads of a KV head are split over several CTAs.
#include <cute/tensor.hpp>

#include "cuda/common/dropout.cuh"
#include "cuda/common/fragment.cuh"
#include "cuda/common/mask.cuh"
#include "cuda/common/mask_tiles.cuh"
#include "cuda/common/sequence_rows.cuh"
#include "cuda/sm80/backward_params.cuh"
#include "cuda/sm80/backward_scores.cuh"
#include "cuda/sm80/backward_tile_ops.cuh"
#include "cuda/sm80/backward_traits.cuh"

namespace flashattn::cuda::sm80 {

// kSoftcap: the scores pass through softcap * tanh(scores / softcap). kAccumulateDq: dQ by
// atomics (off in deterministic mode). kColumns: how tile columns move
// (common/head_columns.cuh): `full` at head dim kHeadDim with 16-byte aligned rows; otherwise
// columns past the head dim are zero-filled on load and not stored. kExtras: the kernel that
// serves ALiBi (cuda/common/alibi.cuh; every tile then takes the masked step) and dropout on P
// (p.dropout), each by a uniform run-time branch, and both dQ modes (dq_accum null: deterministic).
// Template parameters, so that no step carries the code (or the registers) of a case it is not:
// this kernel runs at 255 registers, and ALiBi as a run-time branch in every kernel raised the
// spills from 8-104 to 224-332 bytes (ptxas, d = 128, 2026-11-26); one extras instance instead of
// a flag each keeps this file's instances (and build time) from multiplying.
template <class Traits, bool kSoftcap, bool kAccumulateDq, ColumnMode kColumns = ColumnMode::full,
          bool kExtras = false>
__global__ void __launch_bounds__(Traits::kThreads, Traits::kMinBlocksPerSm)
    backward_dkdv_kernel(const __grid_constant__ BackwardParams p) {
  using namespace cute;
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kHeadDim = Traits::kHeadDim;
  using BlockM = Int<kBlockM>;
  using BlockN = Int<kBlockN>;
  using HeadDim = Int<kHeadDim>;

  const int tid = threadIdx.x;
  const int b = blockIdx.z;
  const int kv_head = blockIdx.y / p.head_splits, split = blockIdx.y % p.head_splits;
  const SequenceRows seq = sequence_rows(b, p.seqlen_q, p.seqlen_k, p.cu_seqlens_q, p.cu_seqlens_k);
  const int key0 = blockIdx.x * kBlockN;
  if (key0 >= seq.len_k) return;  // a shorter sequence of a varlen batch
  const int valid_keys = seq.len_k - key0;

  // The query blocks that see this key block, for each query head of this CTA's chunk.
  const QueryRows rows = rows_seeing_keys(seq.len_q, seq.len_k, p.window_left, p.window_right, key0,
                                          min(key0 + kBlockN, seq.len_k));
  const int m_first = rows.empty() ? 0 : rows.begin / kBlockM;
  const int m_count = rows.empty() ? 0 : (rows.end + kBlockM - 1) / kBlockM - m_first;
  const int heads_per_split = p.group_size() / p.head_splits;
  const int head_first = kv_head * p.group_size() + split * heads_per_split;
  const int steps = m_count * heads_per_split;
  // A step is one (query head, query block) pair: query blocks innermost.
  struct Step {
    int head, m_block;
  };
  auto next_step = [&](Step s) {
    return s.m_block + 1 < m_first + m_count ? Step{s.head, s.m_block + 1} : Step{s.head + 1, m_first};
  };

  // A (rows x head_dim) tile of a (batch, seq, head, dim) operand.
  auto row_tile = [&](const detail::SeqTensor& t, std::int64_t row, int head, auto tile_rows) {
    Element* base = static_cast<Element*>(t.data) + b * t.batch_stride + row * t.seq_stride +
                    std::int64_t(head) * t.head_stride;
    return make_tensor(make_gmem_ptr(base),
                       make_layout(make_shape(tile_rows, HeadDim{}), make_stride(t.seq_stride, _1{})));
  };
  // Per-step views are the first step's shifted by a uniform element offset, so that each
  // thread's address arithmetic is done once, outside the loop.
  const int row_first = m_first * kBlockM;
  auto shifted = [](const auto& t, std::int64_t offset) { return make_tensor(t.data() + offset, t.layout()); };
  auto step_offset = [&](const detail::SeqTensor& t, Step s) {
    return std::int64_t(s.head - head_first) * t.head_stride + std::int64_t(s.m_block * kBlockM - row_first) * t.seq_stride;
  };
  // Shared memory.
  extern __shared__ __align__(1024) char smem_raw[];
  auto& smem = *reinterpret_cast<typename Traits::SharedStorage*>(smem_raw);
  Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Traits::LayoutQ{});     // (M, D, stage)
  Tensor sQt = make_tensor(make_smem_ptr(smem.q.data()), typename Traits::LayoutQt{});   // (D, M, stage)
  Tensor sdO = make_tensor(make_smem_ptr(smem.dout.data()), typename Traits::LayoutdO{});
  Tensor sdOt = make_tensor(make_smem_ptr(smem.dout.data()), typename Traits::LayoutdOt{});
  Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Traits::LayoutKV{});
  Tensor sKt = make_tensor(make_smem_ptr(smem.k.data()), typename Traits::LayoutKVt{});
  Tensor sV = make_tensor(make_smem_ptr(smem.v.data()), typename Traits::LayoutKV{});
  Tensor sP = make_tensor(make_smem_ptr(smem.p.data()), typename Traits::LayoutPdS{});
  Tensor sPt = make_tensor(make_smem_ptr(smem.p.data()), typename Traits::LayoutPdSt{});
  Tensor sdS = make_tensor(make_smem_ptr(smem.ds.data()), typename Traits::LayoutPdS{});
  Tensor sdSt = make_tensor(make_smem_ptr(smem.ds.data()), typename Traits::LayoutPdSt{});

  // Global -> shared loads (cp.async, rows beyond the sequence zero-filled).
  typename Traits::GmemLoad gmem_load;
  auto load_thr = gmem_load.get_thread_slice(tid);
  Tensor load_coords_m = load_thr.partition_S(make_identity_tensor(Shape<BlockM, HeadDim>{}));
  Tensor load_coords_n = load_thr.partition_S(make_identity_tensor(Shape<BlockN, HeadDim>{}));
  Tensor tQgQ = load_thr.partition_S(row_tile(p.q, seq.row_q + row_first, head_first, BlockM{}));
  Tensor tdOgdO = load_thr.partition_S(row_tile(p.dout, seq.row_q + row_first, head_first, BlockM{}));
  auto load_q = [&](Step s, int stage) {
    load_tile_async<kColumns>(gmem_load, shifted(tQgQ, step_offset(p.q, s)), load_thr.partition_D(sQ(_, _, stage)),
                    load_coords_m, seq.len_q - s.m_block * kBlockM, p.cols);
  };
  auto load_dout = [&](Step s) {
    load_tile_async<kColumns>(gmem_load, shifted(tdOgdO, step_offset(p.dout, s)), load_thr.partition_D(sdO),
                    load_coords_m, seq.len_q - s.m_block * kBlockM, p.cols);
  };

  // The three warp arrangements and their ldmatrix copies (backward_config.cuh).
  typename Traits::MmaSdP mma_sdp;
  typename Traits::MmadKV mma_dkv;
  typename Traits::MmadQ mma_dq;
  auto thr_sdp = mma_sdp.get_thread_slice(tid);
  auto thr_dkv = mma_dkv.get_thread_slice(tid);
  auto thr_dq = mma_dq.get_thread_slice(tid);

  auto ldsm_sdp_a = make_tiled_copy_A(LdsmAtom<Element>{}, mma_sdp);
  auto ldsm_sdp_b = make_tiled_copy_B(LdsmAtom<Element>{}, mma_sdp);
  auto ldsm_dkv_a = make_tiled_copy_A(LdsmTransposedAtom<Element>{}, mma_dkv);
  auto ldsm_dkv_b = make_tiled_copy_B(LdsmTransposedAtom<Element>{}, mma_dkv);
  auto ldsm_dq_a = make_tiled_copy_A(LdsmAtom<Element>{}, mma_dq);
  auto ldsm_dq_b = make_tiled_copy_B(LdsmTransposedAtom<Element>{}, mma_dq);

  Tensor tSsQ = ldsm_sdp_a.get_thread_slice(tid).partition_S(sQ);     // (CPY, M, K, stage)
  Tensor tdPsdO = ldsm_sdp_a.get_thread_slice(tid).partition_S(sdO);
  Tensor tSsK = ldsm_sdp_b.get_thread_slice(tid).partition_S(sK);
  Tensor tdPsV = ldsm_sdp_b.get_thread_slice(tid).partition_S(sV);
  Tensor tdVsPt = ldsm_dkv_a.get_thread_slice(tid).partition_S(sPt);
  Tensor tdKsdSt = ldsm_dkv_a.get_thread_slice(tid).partition_S(sdSt);
  Tensor tdVsdOt = ldsm_dkv_b.get_thread_slice(tid).partition_S(sdOt);
  Tensor tdKsQt = ldsm_dkv_b.get_thread_slice(tid).partition_S(sQt);  // (CPY, N, K, stage)
  Tensor tdQsdS = ldsm_dq_a.get_thread_slice(tid).partition_S(sdS);
  Tensor tdQsKt = ldsm_dq_b.get_thread_slice(tid).partition_S(sKt);

  // Register fragments of the operands.
  Tensor tSrQ = thr_sdp.partition_fragment_A(sQ(_, _, 0));
  Tensor tSrK = thr_sdp.partition_fragment_B(sK);
  Tensor tdPrdO = thr_sdp.partition_fragment_A(sdO);
  Tensor tdPrV = thr_sdp.partition_fragment_B(sV);
  Tensor tdVrPt = thr_dkv.partition_fragment_A(sPt);
  Tensor tdVrdOt = thr_dkv.partition_fragment_B(sdOt);
  Tensor tdKrdSt = thr_dkv.partition_fragment_A(sdSt);
  Tensor tdKrQt = thr_dkv.partition_fragment_B(sQt(_, _, 0));
  Tensor tdQrdS = thr_dq.partition_fragment_A(sdS);
  Tensor tdQrKt = thr_dq.partition_fragment_B(sKt);

  // P and dS: accumulators -> shared memory.
  auto store_pds = make_tiled_copy_C(FragmentStoreAtom<Element>{}, mma_sdp);
  auto store_pds_thr = store_pds.get_thread_slice(tid);
  Tensor tPsP = store_pds_thr.partition_D(sP);
  Tensor tdSsdS = store_pds_thr.partition_D(sdS);

  // Tile-local (row, key) and (row, dim) coordinates of the accumulators.
  Tensor s_coords = rowcol_view(thr_sdp.partition_C(make_identity_tensor(Shape<BlockM, BlockN>{})));
  constexpr int kRows = decltype(size<0>(s_coords))::value;
  [[maybe_unused]] Tensor s_coords_acc = thr_sdp.partition_C(make_identity_tensor(Shape<BlockM, BlockN>{}));
  [[maybe_unused]] DropoutStream dropout_rng;
  const bool alibi = kExtras && p.alibi.enabled(), dropout = kExtras && p.dropout.enabled();
  // The extras instance serves both dQ modes: deterministic mode leaves dq_accum null.
  const bool accumulate_dq = kAccumulateDq && (!kExtras || p.dq_accum != nullptr);
  if (dropout) dropout_rng = DropoutStream::load(p.dropout, p.heads_q);
  // The S/dP warps sit side by side along the keys unless there is one column of them.
  constexpr bool kConsecutiveTiles = kDropoutConsecutiveTiles<Traits::kWarps / Traits::kSdPWarpsM>;

  Tensor acc_dk = partition_fragment_C(mma_dkv, Shape<BlockN, HeadDim>{});
  Tensor acc_dv = partition_fragment_C(mma_dkv, Shape<BlockN, HeadDim>{});
  clear(acc_dk);
  clear(acc_dv);

  const ScoreTransform transform = ScoreTransform::make(p.scale, p.softcap);
  // The dQ accumulator's (BlockM x HeadDim) tile of the first step, in kDqBlock x kDqBlock
  // blocks (backward_params.cuh); later steps shift it by whole row groups and heads.
  constexpr int kDqBlock = BackwardParams::kDqBlock;
  using DqBlock = Int<kDqBlock>;
  const std::int64_t dq_group_stride = p.dq_accum_group_stride(kHeadDim);
  const auto dq_tile_layout = make_layout(
      make_shape(make_shape(DqBlock{}, Int<kBlockM / kDqBlock>{}), make_shape(DqBlock{}, Int<kHeadDim / kDqBlock>{})),
      make_stride(make_stride(DqBlock{}, dq_group_stride), make_stride(_1{}, Int<kDqBlock * kDqBlock>{})));
  Tensor tdQgdQ = thr_dq.partition_C(make_tensor(
      make_gmem_ptr(kAccumulateDq && p.dq_accum ? p.dq_accum + p.dq_accum_offset(p.dq_accum_row(b, seq.dense_q, row_first),
                                                                   head_first, 0, kHeadDim)
                                  : nullptr),
      dq_tile_layout));

  if (steps > 0) {
    load_tile_async<kColumns>(gmem_load, load_thr.partition_S(row_tile(p.k, seq.row_k + key0, kv_head, BlockN{})),
                    load_thr.partition_D(sK), load_coords_n, valid_keys, p.cols);
    load_tile_async<kColumns>(gmem_load, load_thr.partition_S(row_tile(p.v, seq.row_k + key0, kv_head, BlockN{})),
                    load_thr.partition_D(sV), load_coords_n, valid_keys, p.cols);
    load_q(Step{head_first, m_first}, 0);
    load_dout(Step{head_first, m_first});
  }
  cp_async_fence();

  // One step. `next` is the step whose Q and dO load during this one (the last step reloads
  // its own: a uniform, unpredicated load costs less than the predicates it would need).
  // kMasked: the tile needs element-wise masking. Instantiated once per kind of tile and
  // chosen by a branch: were the two merged, every tile would issue both. (A third variant, for
  // ALiBi, made cicc stop inlining this lambda, and the accumulators went to the stack: 3.2 KB
  // frames, 2026-11-26. ALiBi kernels run the masked variant alone.)
  auto run_step = [&](int stage, Step current, Step next, const BlockMask& tile_mask, auto masked) {
    constexpr bool kMasked = decltype(masked)::value;
    const int head = current.head;
    const int row0 = current.m_block * kBlockM;
    const int valid_rows = seq.len_q - row0;
    const std::int64_t stats_offset = std::int64_t(head) * p.dense_rows_q + seq.dense_q + row0;
    float lse_log2[kRows], delta[kRows];
    load_row_stats(lse_log2, delta, s_coords, p.lse_log2 + stats_offset, p.delta + stats_offset, valid_rows);

    cp_async_wait<0>();
    __syncthreads();  // Q, dO of this step landed; every warp is done with the previous step

    Tensor acc_s = partition_fragment_C(mma_sdp, Shape<BlockM, BlockN>{});
    Tensor acc_dp = partition_fragment_C(mma_sdp, Shape<BlockM, BlockN>{});
    clear(acc_s);
    clear(acc_dp);
    gemm_smem(mma_sdp, acc_s, tSrQ, tSrK, tSsQ(_, _, _, stage), tSsK, ldsm_sdp_a, ldsm_sdp_b);
    gemm_smem(mma_sdp, acc_dp, tdPrdO, tdPrV, tdPsdO, tdPsV, ldsm_sdp_a, ldsm_sdp_b);

    load_q(next, stage ^ 1);
    cp_async_fence();

    Tensor s_rc = rowcol_view(acc_s);
    Tensor dp_rc = rowcol_view(acc_dp);
    [[maybe_unused]] DropoutBits<decltype(size(acc_s))::value> keep;
    if (dropout) {
      keep.template draw<kConsecutiveTiles>(acc_s, s_coords_acc, dropout_rng, b, head, row0, key0);
      keep.scale(acc_dp, p.dropout.keep_scale);  // dP z
    }
    if (alibi)
      scores_to_gradients<kMasked, kSoftcap>(s_rc, dp_rc, s_coords, lse_log2, delta, transform, tile_mask, key0,
                                             alibi_rows<kRows>(p.alibi, b, head, s_coords, row0, seq.len_q, seq.len_k));
    else
      scores_to_gradients<kMasked, kSoftcap>(s_rc, dp_rc, s_coords, lse_log2, delta, transform, tile_mask, key0);
    if (dropout) keep.scale(acc_s, p.dropout.keep_scale);  // P z, for dV

    copy(store_pds, store_pds_thr.retile_S(convert_fragment<Element>(acc_s)), tPsP);
    copy(store_pds, store_pds_thr.retile_S(convert_fragment<Element>(acc_dp)), tdSsdS);
    __syncthreads();  // P, dS visible to every warp

    gemm_smem(mma_dkv, acc_dv, tdVrPt, tdVrdOt, tdVsPt, tdVsdOt, ldsm_dkv_a, ldsm_dkv_b);
    __syncthreads();  // every warp is done with dO
    load_dout(next);
    cp_async_fence();

    if (accumulate_dq) {  // a compile-time constant except in the extras instance
      // Whole blocks, rows past the sequence's end included (they add zeros to the padding):
      // no branches, so the compiler interleaves the atomics with the dK GEMM below.
      Tensor acc_dq = partition_fragment_C(mma_dq, Shape<BlockM, HeadDim>{});
      clear(acc_dq);
      gemm_smem(mma_dq, acc_dq, tdQrdS, tdQrKt, tdQsdS, tdQsKt, ldsm_dq_a, ldsm_dq_b);
      const std::int64_t dq_offset =
          (row0 - row_first) / kDqBlock * dq_group_stride + (head - head_first) * kHeadDim * kDqBlock;
      atomic_add(acc_dq, shifted(tdQgdQ, dq_offset));
    }
    gemm_smem(mma_dkv, acc_dk, tdKrdSt, tdKrQt, tdKsdSt, tdKsQt(_, _, _, stage), ldsm_dkv_a, ldsm_dkv_b);
  };

  Step current{head_first, m_first};
  for (int step = 0; step < steps; ++step) {
    const Step next = step + 1 < steps ? next_step(current) : current;
    const int row0 = current.m_block * kBlockM;
    const BlockMask tile_mask{seq.len_q, seq.len_k, p.window_left, p.window_right, row0,
                              min(row0 + kBlockM, seq.len_q) - 1};
    if (!alibi && tile_mask.tile_fully_visible(blockIdx.x, kBlockN))
      run_step(step & 1, current, next, tile_mask, cute::false_type{});
    else
      run_step(step & 1, current, next, tile_mask, cute::true_type{});
    current = next;
  }

  // Epilogue: dK = scale * sum dS^T Q; dV = sum P^T dO.
  CUTE_UNROLL
  for (int i = 0; i < size(acc_dk); ++i) acc_dk(i) *= p.scale;
  cp_async_wait<0>();
  __syncthreads();  // K and V are no longer read: their shared memory stages dK and dV

  if (p.head_splits == 1) {
    auto store_frag = make_tiled_copy_C(FragmentStoreAtom<Element>{}, mma_dkv);
    auto store_frag_thr = store_frag.get_thread_slice(tid);
    Tensor sdK = sK;
    Tensor sdV = sV;
    copy(store_frag, store_frag_thr.retile_S(convert_fragment<Element>(acc_dk)), store_frag_thr.partition_D(sdK));
    copy(store_frag, store_frag_thr.retile_S(convert_fragment<Element>(acc_dv)), store_frag_thr.partition_D(sdV));
    __syncthreads();
    typename Traits::GmemStore gmem_store;
    auto store_thr = gmem_store.get_thread_slice(tid);
    Tensor store_coords = store_thr.partition_S(make_identity_tensor(Shape<BlockN, HeadDim>{}));
    store_tile<kColumns>(gmem_store, store_thr.partition_S(sdK),
                         store_thr.partition_D(row_tile(p.dk, seq.row_k + key0, kv_head, BlockN{})), store_coords,
                         valid_keys, p.cols);
    store_tile<kColumns>(gmem_store, store_thr.partition_S(sdV),
                         store_thr.partition_D(row_tile(p.dv, seq.row_k + key0, kv_head, BlockN{})), store_coords,
                         valid_keys, p.cols);
  } else {
    const std::int64_t row_stride = std::int64_t(p.heads_kv) * kHeadDim;
    const std::int64_t offset = ((split * p.dense_rows_k + seq.dense_k + key0) * p.heads_kv + kv_head) * kHeadDim;
    Tensor kv_coords = rowcol_view(thr_dkv.partition_C(make_identity_tensor(Shape<BlockN, HeadDim>{})));
    auto partial_tile = [&](float* base) {
      return rowcol_view(thr_dkv.partition_C(
          make_tensor(make_gmem_ptr(base + offset), make_layout(Shape<BlockN, HeadDim>{}, make_stride(row_stride, _1{})))));
    };
    store_pairs(rowcol_view(acc_dk), partial_tile(p.dk_partial), kv_coords, valid_keys);
    store_pairs(rowcol_view(acc_dv), partial_tile(p.dv_partial), kv_coords, valid_keys);
  }
}

}  // namespace flashattn::cuda::sm80
