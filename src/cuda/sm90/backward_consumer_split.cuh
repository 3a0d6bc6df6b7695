#pragma once
// The consumer warpgroups of the sm90 backward at head dims 192 and 256 (the head-dim-split
// arrangement of backward_traits.cuh). The CTA owns 64 keys; per step (one query head's block of
// 64 query rows) warpgroup w
//   1. computes S^T = K Q_w^T and dP^T = V dO_w^T over its 32 query rows Q_w, back to back;
//   2. turns them into P^T and dS^T (the same element-wise middle as the keys-split consumers,
//      backward_consumer.cuh), and writes both to shared memory as the columns of its queries;
//   3. once both warpgroups have written theirs (one named barrier): dQ[:, half w] = dS K[:, half w],
//      dV[:, half w] += P^T dO[:, half w] and dK[:, half w] += dS^T Q[:, half w], all from shared
//      memory, issued in that order;
//   4. adds dQ into the fp32 accumulator (in the accumulator's fragment order, backward_traits.cuh)
//      while dV and dK compute: half of it with 16-byte reductions from registers, the other half
//      staged in its half of the step's dO stage once its dV GEMM has read it, for the producer's
//      dQ writer warp, which adds that half with a bulk reduce-add and releases the dO stage; it
//      releases the Q stage itself when dK is done. In deterministic mode it adds only once the
//      producer's warp 2 has taken the dQ block's turn, at 192 all of dQ from registers (releasing
//      the dO stage itself; BackwardTraits::kOrderedDqStaged), and its staging barrier tells warps
//      1 and 2 that its reductions are issued; warp 1 passes the turn on (backward_producer.cuh).
// P^T and dS^T have two stages: a warpgroup writes step s + 1's while the other may still read
// step s's, and it reaches step s + 2's barrier only after finishing step s's GEMMs.
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "cuda/sm90/backward_consumer.cuh"

namespace flashattn::cuda::sm90 {

// red.global.add.v4.f32: adds four fp32 values to 16-byte-aligned global memory (at L2).
CUTE_DEVICE void reduce_add_v4(float* dst, float a, float b, float c, float d) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst), "f"(a), "f"(b), "f"(c), "f"(d)
               : "memory");
}

// One tile (carry: as run_backward_consumer's). kOrderedDq: deterministic mode.
template <class Traits, bool kSoftcap, bool kDropout = false, bool kAlibi = false, bool kOrderedDq = false>
CUTE_DEVICE void run_backward_consumer_split(BackwardParams<Traits> const& p, typename Traits::SharedStorage& smem,
                                             BackwardTile const& t, typename Traits::PipelineQ& pipeline_q,
                                             typename Traits::PipelinedO& pipeline_do,
                                             ConsumerCarry<Traits>& carry, int thread, int warp_group) {
  using namespace cute;
  using NamedBarrier = cutlass::arch::NamedBarrier;
  using Element = typename Traits::Element;
  static_assert(Traits::kSplitHeadDim);
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kHeadDim = Traits::kHeadDim;
  constexpr int kQueries = Traits::kQueriesPerWarpGroup, kCols = Traits::kDkvCols, kStages = Traits::kStages;
  auto& state = carry.state;
  auto& trace = carry.trace;

  Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Traits::SmemLayoutQ{});     // (M, D, stage)
  Tensor sQt = make_tensor(make_smem_ptr(smem.q.data()), typename Traits::SmemLayoutQt{});   // (D, M, stage)
  Tensor sdO = make_tensor(make_smem_ptr(smem.dout.data()), typename Traits::SmemLayoutdO{});
  Tensor sdOt = make_tensor(make_smem_ptr(smem.dout.data()), typename Traits::SmemLayoutQt{});
  Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Traits::SmemLayoutK{});     // (N, D)
  Tensor sKt = make_tensor(make_smem_ptr(smem.k.data()), typename Traits::SmemLayoutKt{});   // (D, N)
  Tensor sV = make_tensor(make_smem_ptr(smem.v.data()), typename Traits::SmemLayoutV{});
  Tensor sdS = make_tensor(make_smem_ptr(smem.ds.data()), typename Traits::SmemLayoutdS{});    // (M, N, stage)
  Tensor sdSt = make_tensor(make_smem_ptr(smem.ds.data()), typename Traits::SmemLayoutdSt{});  // (N, M, stage)
  Tensor sPt = make_tensor(make_smem_ptr(smem.pt.data()), typename Traits::SmemLayoutdSt{});   // (N, M, stage)
  Tensor sLSE = make_tensor(make_smem_ptr(smem.lse.data()), typename Traits::SmemLayoutRowStats{});  // (M, stage)
  Tensor sD = make_tensor(make_smem_ptr(smem.delta.data()), typename Traits::SmemLayoutRowStats{});
  // This warpgroup's query rows (S^T, dP^T), their columns of P^T and dS^T, and its half of the
  // head dim (dK, dV, dQ).
  Tensor sQw = local_tile(sQ, Shape<Int<kQueries>, Int<kHeadDim>, Int<kStages>>{}, make_coord(warp_group, _0{}, _0{}));
  Tensor sdOw = local_tile(sdO, Shape<Int<kQueries>, Int<kHeadDim>, Int<kStages>>{}, make_coord(warp_group, _0{}, _0{}));
  Tensor sQtw = local_tile(sQt, Shape<Int<kCols>, Int<kBlockM>, Int<kStages>>{}, make_coord(warp_group, _0{}, _0{}));
  Tensor sdOtw = local_tile(sdOt, Shape<Int<kCols>, Int<kBlockM>, Int<kStages>>{}, make_coord(warp_group, _0{}, _0{}));
  Tensor sKtw = local_tile(sKt, Shape<Int<Traits::kDqCols>, Int<kBlockN>>{}, make_coord(warp_group, _0{}));
  Tensor sdStw = local_tile(sdSt, Shape<Int<kBlockN>, Int<kQueries>, Int<kStages>>{}, make_coord(_0{}, warp_group, _0{}));
  Tensor sPtw = local_tile(sPt, Shape<Int<kBlockN>, Int<kQueries>, Int<kStages>>{}, make_coord(_0{}, warp_group, _0{}));

  typename Traits::MmaSdP mma_sdp;
  typename Traits::MmadKV mma_dkv;
  typename Traits::MmadQ mma_dq;
  auto thr_sdp = mma_sdp.get_thread_slice(thread);
  auto thr_dkv = mma_dkv.get_thread_slice(thread);
  auto thr_dq = mma_dq.get_thread_slice(thread);
  Tensor tSrK = thr_sdp.partition_fragment_A(sK);
  Tensor tSrQ = thr_sdp.partition_fragment_B(sQw);     // (.., stage)
  Tensor tdPrV = thr_sdp.partition_fragment_A(sV);
  Tensor tdPrdO = thr_sdp.partition_fragment_B(sdOw);  // (.., stage)
  Tensor tdVrP = thr_dkv.partition_fragment_A(sPt);      // (.., stage)
  Tensor tdVrdOt = thr_dkv.partition_fragment_B(sdOtw);  // (.., stage)
  Tensor tdKrdS = thr_dkv.partition_fragment_A(sdSt);    // (.., stage)
  Tensor tdKrQt = thr_dkv.partition_fragment_B(sQtw);    // (.., stage)
  Tensor tdQrdS = thr_dq.partition_fragment_A(sdS);      // (.., stage)
  Tensor tdQrKt = thr_dq.partition_fragment_B(sKtw);

  auto store_pds = make_tiled_copy_C(typename Traits::StoredS{}, mma_sdp);
  auto thr_store_pds = store_pds.get_thread_slice(thread);
  Tensor tPsP = thr_store_pds.partition_D(sPtw);    // (.., stage)
  Tensor tdSsdS = thr_store_pds.partition_D(sdStw);  // (.., stage)

  // (key, query within this warpgroup's rows), per element of the row-column view.
  Tensor coords = gmma_rowcol(thr_sdp.partition_C(make_identity_tensor(Shape<Int<kBlockN>, Int<kQueries>>{})));
  [[maybe_unused]] Tensor drop_coords =
      gmma_as_m16n8(thr_sdp.partition_C(make_identity_tensor(Shape<Int<kBlockN>, Int<kQueries>>{})));
  [[maybe_unused]] DropoutStream dropout_rng;
  if constexpr (kDropout) dropout_rng = DropoutStream::load(p.dropout, p.heads_q);

  Tensor acc_dk = partition_fragment_C(mma_dkv, Shape<Int<kBlockN>, Int<kCols>>{});
  Tensor acc_dv = partition_fragment_C(mma_dkv, Shape<Int<kBlockN>, Int<kCols>>{});
  clear(acc_dk);
  clear(acc_dv);

  const int key0 = t.key0;
  const int query_skip = warp_group * kQueries;                  // this warpgroup's first row of a block
  const int stats_skip = int(t.seq.dense_q & 3) + query_skip;    // ... in its statistics stage
  const int shift = t.seq.len_k - t.seq.len_q, key_end = t.seq.len_k - key0;
  const int lowest_diff = p.window_left >= 0 ? shift - p.window_left : -(1 << 30);
  const int highest_diff = p.window_right >= 0 ? shift + p.window_right : (1 << 30);
  const std::int64_t first_dq_block = p.dq_layout.first_block(t.batch, t.seq.dense_q);
  trace(TraceEvent::tile);
  if (t.steps > 0) cutlass::arch::ClusterTransactionBarrier::wait(&smem.kv_loaded, carry.kv_tiles & 1);
  trace(TraceEvent::operands);

  auto run_step = [&](BackwardTile::Step step, auto masked) {
    constexpr bool kMasked = decltype(masked)::value;
    const int stage = state.index();
    const int row0 = step.m_block * kBlockM + query_skip;  // this warpgroup's first query row

    Tensor acc_s = partition_fragment_C(mma_sdp, Shape<Int<kBlockN>, Int<kQueries>>{});
    Tensor acc_dp = partition_fragment_C(mma_sdp, Shape<Int<kBlockN>, Int<kQueries>>{});
    trace(TraceEvent::step);
    pipeline_q.consumer_wait(state);
    warpgroup_gemm<true>(mma_sdp, tSrK, tSrQ(_, _, _, stage), acc_s);
    pipeline_do.consumer_wait(state);
    warpgroup_gemm<true>(mma_sdp, tdPrV, tdPrdO(_, _, _, stage), acc_dp);

    auto lse_of = [&](int c) { return sLSE(stats_skip + get<1>(coords(0, c)), stage); };
    auto delta_of = [&](int c) { return sD(stats_skip + get<1>(coords(0, c)), stage); };
    auto visible = [&, query_end = t.seq.len_q - row0, lowest = lowest_diff + row0 - key0,
                    highest = highest_diff + row0 - key0](int r, int c) {
      const int query = get<1>(coords(r, c)), key = get<0>(coords(r, c)), diff = key - query;
      return query < query_end && key < key_end && diff >= lowest && diff <= highest;
    };
    step_gradients_of_scores<kMasked, kSoftcap, kDropout, kAlibi>(p, acc_s, acc_dp, coords, drop_coords, dropout_rng,
                                                                 lse_of, delta_of, visible, t.batch, step.head, key0,
                                                                 row0, shift);
    trace(TraceEvent::scores);

    // P^T and dS^T to shared memory; the other warpgroup writes the other query columns.
    {
      Tensor p_t = convert_fragment<Element>(acc_s);
      Tensor ds_t = convert_fragment<Element>(acc_dp);
      copy(store_pds, thr_store_pds.retile_S(p_t), tPsP(_, _, _, stage));
      copy(store_pds, thr_store_pds.retile_S(ds_t), tdSsdS(_, _, _, stage));
    }
    cutlass::arch::fence_view_async_shared();  // written by ordinary stores, read by wgmma
    NamedBarrier::sync(Traits::kConsumerThreads, kBarrierDsWritten);
    trace(TraceEvent::ds_shared);

    // dQ first, so that its reductions to global memory go out while dV and dK compute.
    Tensor acc_dq = partition_fragment_C(mma_dq, Shape<Int<kBlockM>, Int<Traits::kDqCols>>{});
    Tensor tdQrdS_stage = tdQrdS(_, _, _, stage);
    warpgroup_gemm<true>(mma_dq, tdQrdS_stage, tdQrKt, acc_dq);
    Tensor tdVrP_stage = tdVrP(_, _, _, stage);
    warpgroup_gemm<false>(mma_dkv, tdVrP_stage, tdVrdOt(_, _, _, stage), acc_dv);
    Tensor tdKrdS_stage = tdKrdS(_, _, _, stage);
    warpgroup_gemm<false>(mma_dkv, tdKrdS_stage, tdKrQt(_, _, _, stage), acc_dk);
    warpgroup_wait<2>();  // dQ done

    // dQ into the accumulator: thread t's i-th group of 4 values at (i * 128 + t) * 4 of this
    // warpgroup's part of the block, as backward_dq_convert.cuh reads it: the second half by 16-byte
    // reductions from registers, and the first staged in this warpgroup's half of the dO stage once
    // its dV GEMM has read it, for the producer's dQ writer warp, which adds it with a bulk
    // reduce-add and releases the stage (half as many reductions hold up the warpgroup).
    // Deterministic mode: in the turn the producer's warp 2 takes for the block, and at 192 all of
    // it by reductions (kOrderedDqStaged).
    constexpr bool kStaging = !kOrderedDq || Traits::kOrderedDqStaged;
    constexpr int kVectors = decltype(size(acc_dq))::value / 4;
    constexpr int kFirstReduced = kStaging ? kVectors / 2 : 0;
    auto dq_vector = [&](int i) {
      return make_float4(acc_dq(4 * i), acc_dq(4 * i + 1), acc_dq(4 * i + 2), acc_dq(4 * i + 3));
    };
    float* dst = p.dq_accum + p.dq_layout.block_offset(step.head, first_dq_block + step.m_block) +
                 warp_group * Traits::kDqElems;
    // This warpgroup and the producer's warp 1 (deterministic mode: and warp 2).
    constexpr int kStagedThreads = kOrderedDq ? kOrderedStagedThreads : 128 + 32;
    if constexpr (kOrderedDq) NamedBarrier::sync(kTurnTakenThreads, kBarrierDqTurnTaken0 + warp_group);
    CUTE_UNROLL
    for (int i = kFirstReduced; i < kVectors; ++i) {
      const float4 v = dq_vector(i);
      reduce_add_v4(dst + (i * 128 + thread) * 4, v.x, v.y, v.z, v.w);
    }
    if constexpr (!kStaging) NamedBarrier::arrive(kStagedThreads, dq_staged_barrier(stage, warp_group));
    warpgroup_wait<1>();  // dV done: dO is free
    if constexpr (kStaging) {
      float4* staged = reinterpret_cast<float4*>(Traits::dq_staging(smem.dout.data(), stage, warp_group));
      CUTE_UNROLL
      for (int i = 0; i < kFirstReduced; ++i) staged[i * 128 + thread] = dq_vector(i);
      cutlass::arch::fence_view_async_shared();  // read next by the bulk reduce-add
      NamedBarrier::arrive(kStagedThreads, dq_staged_barrier(stage, warp_group));
    } else {
      pipeline_do.consumer_release(state);
    }
    warpgroup_wait<0>();  // dK done: Q is free
    pipeline_q.consumer_release(state);
    trace(TraceEvent::step_done);
    ++state;
  };

  for (int i = 0; i < t.steps; ++i) {
    const BackwardTile::Step step = t.step(i);
    const BlockMask mask = query_block_mask(t, p.window_left, p.window_right, step.m_block, kBlockM);
    const bool full_rows = (step.m_block + 1) * kBlockM <= t.seq.len_q;
    if (!kAlibi && full_rows && mask.tile_fully_visible(t.n_block, kBlockN))
      run_step(step, cute::false_type{});
    else
      run_step(step, cute::true_type{});
  }

  if (t.steps > 0) {  // K and V are read: the producer may load the next tile's
    cutlass::arch::ClusterBarrier::arrive(&smem.kv_free);
    ++carry.kv_tiles;
  }

  // Epilogue: this warpgroup's half of the head dim of dK (times the softmax scale) and dV.
  Tensor out_coords = thr_dkv.partition_C(make_identity_tensor(Shape<Int<kBlockN>, Int<kCols>>{}));
  store_key_gradients<Traits>(p, t, acc_dk, out_coords, key0, warp_group * kCols, p.dk, p.dk_partial, p.scale);
  store_key_gradients<Traits>(p, t, acc_dv, out_coords, key0, warp_group * kCols, p.dv, p.dv_partial, 1.0f);
  trace(TraceEvent::stored);
}

}  // namespace flashattn::cuda::sm90
