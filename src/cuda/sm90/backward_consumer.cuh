#pragma once
// The consumer warpgroups of the sm90 backward (backward_traits.cuh has the five GEMMs). Per
// step (one query head's query block), warpgroup w, which owns 64 of the CTA's keys:
//   1. S^T = K_w Q^T and dP^T = V_w dO^T, issued back to back (at d = 64 K_w and V_w from
//      registers, read once per tile);
//   2. P^T = exp2(S^T * scale log2(e) [+ ALiBi] - LSE log2(e)) while dP^T computes, then dS^T = P^T (dP^T - D),
//      masked where some (query, key) pair of the block is not visible;
//   3. dS^T to shared memory; dV_w += P^T dO with P^T from registers;
//   4. once both warpgroups have written dS: dQ[:, half w] = dS K[:, half w] (at d = 64, once
//      this warpgroup has: dQ_w = dS_w K_w over its own keys) and dK_w += dS^T Q (dS^T from
//      registers);
//   5. dQ to its staging buffer for the dQ writer warp (backward_producer.cuh; at d = 64
//      warpgroup 0 stores its dQ_w and warpgroup 1 adds its own to it), then the Q and dO
//      stages are released.
// After the last step dK (times the softmax scale) and dV go to global memory.
// kDropout: after step 2's P^T, the step's keep bits are drawn (common/dropout.cuh: the stream's
// words as the untransposed tile's lanes draw them, transposed by movmatrix) while dP^T
// computes; dS^T = P^T (dP^T z - D) and dV += (P^T z) dO, z = keep / (1 - p).
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/numeric_conversion.h>

#include "cuda/common/dropout.cuh"
#include "cuda/common/alibi.cuh"
#include "cuda/common/mask.cuh"
#include "cuda/sm90/backward_params.cuh"
#include "cuda/sm90/backward_tile.cuh"
#include "cuda/sm90/gmma_fragment.cuh"
#include "cuda/sm90/trace.cuh"

namespace flashattn::cuda::sm90 {

// tanh to a few float ulps (tanh.approx, which --use_fast_math makes of tanhf, is too coarse for
// fp16 gradients through a softcap). Saturates cleanly to +-1.
CUTE_DEVICE float backward_tanh(float x) {
  const float e2x = __expf(fminf(2.0f * x, 80.0f));
  return 1.0f - __fdividef(2.0f, e2x + 1.0f);
}

// fp32 fragment -> the same registers' order in Element.
template <class Element, class Fragment>
CUTE_DEVICE auto convert_fragment(Fragment const& f) {
  constexpr int kSize = decltype(cute::size(f))::value;
  auto out = cute::make_tensor<Element>(f.layout());
  cutlass::NumericArrayConverter<Element, float, kSize> convert;
  *reinterpret_cast<cutlass::Array<Element, kSize>*>(out.data()) =
      convert(*reinterpret_cast<cutlass::Array<float, kSize> const*>(f.data()));
  return out;
}

// The element-wise middle of a step, on a thread's share of S^T and dP^T (rows: keys, columns:
// queries; row-column views), in two halves so that the first runs while dP^T is computed.
// P^T = exp2(x * log2(e) - LSE * log2(e)) with x = S * scale, or softcap * tanh(S * scale / softcap),
// plus bias(r, c) in base 2 when it is enabled (ALiBi: cuda/common/alibi.cuh);
// 0 where `visible(r, c)` says the pair is masked (kMasked: some pair of the step may be).
// dtanh: softcap only, 1 - tanh^2 per element for the second half.
template <bool kMasked, bool kSoftcap, class Traits, class S, class LseOf, class Visible, class Dtanh,
          class Bias = NoScoreBias>
CUTE_DEVICE void to_probabilities(BackwardParams<Traits> const& p, S& s, LseOf lse_of, Visible visible, Dtanh& dtanh,
                                  Bias const& bias = {}) {
  using namespace cute;
  CUTE_UNROLL
  for (int c = 0; c < size<1>(s); ++c) {
    const float lse = lse_of(c);
    CUTE_UNROLL
    for (int r = 0; r < size<0>(s); ++r) {
      float prob;
      float offset = -lse;
      if constexpr (Bias::kEnabled) offset += bias(r, c);
      if constexpr (kSoftcap) {
        const float t = backward_tanh(s(r, c) * p.softcap_inner);
        prob = exp2f(fmaf(t, p.softcap_outer_log2, offset));
        dtanh(r, c) = 1.0f - t * t;
      } else {
        prob = exp2f(fmaf(s(r, c), p.scale_log2, offset));
      }
      if constexpr (kMasked) {
        if (!visible(r, c)) prob = 0.0f;
      }
      s(r, c) = prob;
    }
  }
}

// dS^T = P^T (dP^T - D) [* (1 - tanh^2)], in place of dP^T. kMasked: the step has query rows past
// the sequence's end, whose D is whatever the workspace holds there (NaN, say): where P^T is 0,
// dS^T is set to 0 rather than computed.
template <bool kMasked, bool kSoftcap, class S, class DP, class DeltaOf, class Dtanh>
CUTE_DEVICE void to_score_gradients(S const& s, DP& dp, DeltaOf delta_of, Dtanh const& dtanh) {
  using namespace cute;
  CUTE_UNROLL
  for (int c = 0; c < size<1>(s); ++c) {
    const float delta = delta_of(c);
    CUTE_UNROLL
    for (int r = 0; r < size<0>(s); ++r) {
      float ds = s(r, c) * (dp(r, c) - delta);
      if constexpr (kSoftcap) ds *= dtanh(r, c);
      if constexpr (kMasked) ds = s(r, c) == 0.0f ? 0.0f : ds;
      dp(r, c) = ds;
    }
  }
}

// The element-wise middle of a step, shared by both consumer arrangements, on a warpgroup's S^T and
// dP^T accumulators (keys x queries; S^T issued first, dP^T second, both still running): waits
// for S^T, turns it into P^T (ALiBi's bias with kAlibi: -slope * |query - key + base| in base 2,
// base = the step's first query row + seqlen_k - seqlen_q - the first key), draws dropout's keep
// bits while dP^T computes, waits for it, and leaves P^T (times z) in acc_s and dS^T in acc_dp.
// coords: (key, query) of each row-column element, local to the part; key0 and row0 its first key
// and query row in the sequence.
template <bool kMasked, bool kSoftcap, bool kDropout, bool kAlibi, class Traits, class Acc, class Coords,
          class DropCoords, class LseOf, class DeltaOf, class Visible>
CUTE_DEVICE void step_gradients_of_scores(BackwardParams<Traits> const& p, Acc& acc_s, Acc& acc_dp, Coords const& coords,
                                          DropCoords const& drop_coords, DropoutStream const& dropout_rng,
                                          LseOf lse_of, DeltaOf delta_of, Visible visible, int batch, int head,
                                          int key0, int row0, int shift) {
  using namespace cute;
  Tensor s = gmma_rowcol(acc_s);
  Tensor dp = gmma_rowcol(acc_dp);
  auto dtanh = [&] {  // registers only where softcap needs them
    if constexpr (kSoftcap) return make_tensor<float>(s.layout());
    else return 0;
  }();
  warpgroup_wait<1>();  // S^T done; dP^T may still run
  if constexpr (kAlibi) {
    // -slope * |query + shift - key| in base 2, from part-local (key, query).
    constexpr float kLog2e = 1.4426950408889634f;
    const float minus_slope_log2 = -kLog2e * p.alibi.slope(batch, head);
    const int base = row0 + shift - key0;
    to_probabilities<kMasked, kSoftcap>(p, s, lse_of, visible, dtanh, score_bias([&](int r, int c) {
      return minus_slope_log2 * fabsf(float(get<1>(coords(r, c)) - get<0>(coords(r, c)) + base));
    }));
  } else {
    to_probabilities<kMasked, kSoftcap>(p, s, lse_of, visible, dtanh);
  }
  [[maybe_unused]] std::uint32_t keep_bits = 0;
  if constexpr (kDropout)
    keep_bits = transposed_keep_bits<decltype(size<2>(drop_coords))::value>(drop_coords, dropout_rng, batch, head,
                                                                             key0, row0);
  warpgroup_wait<0>();
  if constexpr (kDropout) {
    Tensor dp_tiles = gmma_as_m16n8(acc_dp);
    scale_by_keep_bits(dp_tiles, keep_bits, p.dropout.keep_scale);  // dP^T z
  }
  to_score_gradients<kMasked, kSoftcap>(s, dp, delta_of, dtanh);
  if constexpr (kDropout) {
    Tensor s_tiles = gmma_as_m16n8(acc_s);
    scale_by_keep_bits(s_tiles, keep_bits, p.dropout.keep_scale);  // P^T z, for dV
  }
}

// What a consumer warpgroup carries from one tile of its CTA to the next.
template <class Traits>
struct ConsumerCarry {
  typename Traits::PipelineQ::PipelineState state;  // the Q/dO pipelines' position (Q's and dO's advance together)
  int kv_tiles = 0;                                 // tiles that loaded K and V (the K/V barriers' parity)
  Tracer trace;                                     // the development timeline (trace.cuh)
};

// A tile's dK or dV (acc, times `scale`) for the keys inside the sequence: acc's element i is
// (key0 + row, col0 + col) with (row, col) = coords(i); fp32 partials when the query heads of the
// KV head are split over several CTAs (p.head_splits > 1: `partial` is set).
//
// In the output dtype each thread holds, per row, one pair of adjacent columns in every group of 8,
// and the 4 threads of a quad the 4 pairs of a group: stored as they are, a warp's store covers
// 8 rows x 16 bytes, half of eight 32-byte sectors, with 4-byte stores. So the quad first
// transposes its pairs (4 groups at a time), and each thread stores one group, 16 bytes, whole:
// a quarter of the store instructions, whole sectors (the output's rows are 16-byte aligned
// wherever the sm90 backward runs: sm90/api.hpp).
template <class Traits, class Acc, class Coords>
CUTE_DEVICE void store_key_gradients(BackwardParams<Traits> const& p, BackwardTile const& t, Acc const& acc,
                                     Coords const& coords, int key0, int col0, detail::SeqTensor const& out,
                                     float* partial, float scale) {
  using namespace cute;
  using Element = typename Traits::Element;
  if (partial != nullptr) {
    CUTE_UNROLL
    for (int i = 0; i < size(acc); i += 2) {  // fragment pairs are adjacent columns of one row
      const int key = key0 + get<0>(coords(i)), col = col0 + get<1>(coords(i));
      if (key >= t.seq.len_k) continue;
      float* dst = partial +
                   ((t.split * p.dense_rows_k + t.seq.dense_k + key) * p.heads_kv + t.kv_head) * Traits::kHeadDim + col;
      *reinterpret_cast<float2*>(dst) = make_float2(acc(i) * scale, acc(i + 1) * scale);
    }
    return;
  }
  // acc is ((2, 2, G), 1, 1): element c + 2 h + 4 j is column pair c of group j, row half h.
  constexpr int kGroups = decltype(size(acc))::value / 4;
  static_assert(kGroups % 4 == 0, "whole quads of column groups");
  const int quad_lane = int(threadIdx.x % 4);
  const int quad_base = int(threadIdx.x % 32) - quad_lane;
  auto pair_word = [&](int i) {
    cutlass::Array<Element, 2> pair;
    pair[0] = Element(acc(i) * scale);
    pair[1] = Element(acc(i + 1) * scale);
    return *reinterpret_cast<uint32_t*>(&pair);
  };
  CUTE_UNROLL
  for (int h = 0; h < 2; ++h) {
    const int key = key0 + get<0>(coords(2 * h));
    const bool inside = key < t.seq.len_k;
    Element* row = static_cast<Element*>(out.data) + t.batch * out.batch_stride + (t.seq.row_k + key) * out.seq_stride +
                   std::int64_t(t.kv_head) * out.head_stride;
    CUTE_UNROLL
    for (int g = 0; g < kGroups; g += 4) {
      uint32_t words[4];  // this thread's pair in groups g .. g + 3
      CUTE_UNROLL
      for (int j = 0; j < 4; ++j) words[j] = pair_word(4 * (g + j) + 2 * h);
      // Round k: thread q sends its pair of group g + (q + k) % 4 and receives the pair of group
      // g + q held by thread (q - k) % 4, which is column pair (q - k) % 4 of that group.
      uint32_t vec[4] = {0u, 0u, 0u, 0u};
      CUTE_UNROLL
      for (int k = 0; k < 4; ++k) {
        const int send_j = (quad_lane + k) & 3, from = (quad_lane - k) & 3;
        const uint32_t send = send_j == 0 ? words[0] : send_j == 1 ? words[1] : send_j == 2 ? words[2] : words[3];
        const uint32_t got = k == 0 ? send : __shfl_sync(0xffffffffu, send, quad_base + from);
        CUTE_UNROLL
        for (int c = 0; c < 4; ++c) vec[c] = c == from ? got : vec[c];
      }
      // Group g + q's first column: this thread's column in group g, less its pair's offset, plus q groups.
      const int col = col0 + get<1>(coords(4 * g)) - 2 * quad_lane + 8 * quad_lane;
      if (inside) *reinterpret_cast<uint4*>(row + col) = make_uint4(vec[0], vec[1], vec[2], vec[3]);
    }
  }
}

// A step's dQ (acc_dq) to the dQ writer's staging buffer, in fragment order (backward_traits.cuh),
// once the writer has read the previous step's. Each warpgroup has a buffer of its own, except
// with kDqOverOwnKeys, where both partial sums go to one: warpgroup 0 stores its own, warpgroup 1
// adds its to it (always in that order, so deterministic mode's bits do not depend on timing).
// The only wait between the two warpgroups: warpgroup 1 for warpgroup 0's store of the same step.
template <class Traits, class AccDq>
CUTE_DEVICE void stage_dq(typename Traits::SharedStorage& smem, AccDq const& acc_dq, int thread, int warp_group) {
  using namespace cute;
  using NamedBarrier = cutlass::arch::NamedBarrier;
  constexpr int kVectors = decltype(size(acc_dq))::value / 4;
  auto vector = [&](int i) { return make_float4(acc_dq(4 * i), acc_dq(4 * i + 1), acc_dq(4 * i + 2), acc_dq(4 * i + 3)); };
  auto store = [&](float4* staged) {
    CUTE_UNROLL
    for (int i = 0; i < kVectors; ++i) staged[i * 128 + thread] = vector(i);
  };
  if constexpr (Traits::kDqOverOwnKeys) {
    float4* staged = reinterpret_cast<float4*>(smem.dq.data());
    if (warp_group == 0) {
      NamedBarrier::sync(128 + 32, kBarrierDqEmpty0);
      store(staged);
      NamedBarrier::arrive(Traits::kConsumerThreads, kBarrierDqStaged);
    } else {
      NamedBarrier::sync(Traits::kConsumerThreads, kBarrierDqStaged);
      CUTE_UNROLL
      for (int i = 0; i < kVectors; ++i) {
        const float4 a = staged[i * 128 + thread], b = vector(i);
        staged[i * 128 + thread] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
      }
      cutlass::arch::fence_view_async_shared();  // read next by the bulk reduce-add
      NamedBarrier::arrive(128 + 32, kBarrierDqFull0);
    }
  } else {
    NamedBarrier::sync(128 + 32, kBarrierDqEmpty0 + warp_group);
    store(reinterpret_cast<float4*>(smem.dq.data() + warp_group * Traits::kDqElems));
    cutlass::arch::fence_view_async_shared();  // read next by the bulk reduce-add
    NamedBarrier::arrive(128 + 32, kBarrierDqFull0 + warp_group);
  }
}

// One tile; carry: what carries over to the CTA's next tile.
// kAlibi: the scores gain ALiBi's bias (cuda/common/alibi.cuh), every step taking the masked
// variant. A template flag: as a runtime branch it raised the consumers' spills at d = 128 from
// 92 to 288 bytes of reloads (164 to 892 with softcap; ptxas, 2026-11-26) on every path.
template <class Traits, bool kSoftcap, bool kDropout = false, bool kAlibi = false>
CUTE_DEVICE void run_backward_consumer(BackwardParams<Traits> const& p, typename Traits::SharedStorage& smem,
                                       BackwardTile const& t, typename Traits::PipelineQ& pipeline_q,
                                       typename Traits::PipelinedO& pipeline_do,
                                       ConsumerCarry<Traits>& carry, int thread, int warp_group) {
  using namespace cute;
  using NamedBarrier = cutlass::arch::NamedBarrier;
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kHeadDim = Traits::kHeadDim;
  constexpr int kKeys = Traits::kKeysPerWarpGroup, kStages = Traits::kStages;
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
  Tensor sLSE = make_tensor(make_smem_ptr(smem.lse.data()), typename Traits::SmemLayoutRowStats{});  // (M, stage)
  Tensor sD = make_tensor(make_smem_ptr(smem.delta.data()), typename Traits::SmemLayoutRowStats{});
  // This warpgroup's keys, its part of dS^T, and the columns of dQ it computes.
  Tensor sKw = local_tile(sK, Shape<Int<kKeys>, Int<kHeadDim>>{}, make_coord(warp_group, _0{}));
  Tensor sVw = local_tile(sV, Shape<Int<kKeys>, Int<kHeadDim>>{}, make_coord(warp_group, _0{}));
  Tensor sdStw = local_tile(sdSt, Shape<Int<kKeys>, Int<kBlockM>, Int<kStages>>{}, make_coord(warp_group, _0{}, _0{}));
  // The dQ GEMM's operands: dS and K^T over all keys for this warpgroup's half of the columns, or
  // (kDqOverOwnKeys) over this warpgroup's keys for all columns.
  constexpr bool kDqOverOwnKeys = Traits::kDqOverOwnKeys;
  constexpr int kDqKeys = Traits::kDqKeys;
  Tensor sdSq = local_tile(sdS, Shape<Int<kBlockM>, Int<kDqKeys>, Int<kStages>>{},
                           make_coord(_0{}, kDqOverOwnKeys ? warp_group : 0, _0{}));
  Tensor sKtw = local_tile(sKt, Shape<Int<Traits::kDqCols>, Int<kDqKeys>>{},
                           kDqOverOwnKeys ? make_coord(0, warp_group) : make_coord(warp_group, 0));

  typename Traits::MmaSdP mma_sdp;
  typename Traits::MmadKV mma_dkv;
  typename Traits::MmadQ mma_dq;
  auto thr_sdp = mma_sdp.get_thread_slice(thread);
  auto thr_dkv = mma_dkv.get_thread_slice(thread);
  auto thr_dq = mma_dq.get_thread_slice(thread);
  Tensor tSrK = thr_sdp.partition_fragment_A(sKw);
  Tensor tSrQ = thr_sdp.partition_fragment_B(sQ);     // (.., stage)
  Tensor tdPrV = thr_sdp.partition_fragment_A(sVw);
  Tensor tdPrdO = thr_sdp.partition_fragment_B(sdO);  // (.., stage)
  Tensor tdVrdOt = thr_dkv.partition_fragment_B(sdOt);  // (.., stage)
  Tensor tdKrQt = thr_dkv.partition_fragment_B(sQt);    // (.., stage)
  Tensor tdQrdS = thr_dq.partition_fragment_A(sdSq);    // (.., stage)
  Tensor tdQrKt = thr_dq.partition_fragment_B(sKtw);

  auto store_ds = make_tiled_copy_C(typename Traits::StoredS{}, mma_sdp);
  auto thr_store_ds = store_ds.get_thread_slice(thread);
  Tensor tdSsdS = thr_store_ds.partition_D(sdStw);  // (.., stage)

  // (key, query) within this warpgroup's part of the step, per element of the row-column view.
  Tensor coords = gmma_rowcol(thr_sdp.partition_C(make_identity_tensor(Shape<Int<kKeys>, Int<kBlockM>>{})));
  [[maybe_unused]] Tensor drop_coords =
      gmma_as_m16n8(thr_sdp.partition_C(make_identity_tensor(Shape<Int<kKeys>, Int<kBlockM>>{})));
  [[maybe_unused]] DropoutStream dropout_rng;
  if constexpr (kDropout) dropout_rng = DropoutStream::load(p.dropout, p.heads_q);

  Tensor acc_dk = partition_fragment_C(mma_dkv, Shape<Int<kKeys>, Int<kHeadDim>>{});
  Tensor acc_dv = partition_fragment_C(mma_dkv, Shape<Int<kKeys>, Int<kHeadDim>>{});
  clear(acc_dk);
  clear(acc_dv);

  const int key0 = t.key0 + warp_group * kKeys;  // this warpgroup's first key
  const int stats_skip = int(t.seq.dense_q & 3);  // rows before a step's first in its statistics stage
  // The mask as bounds on key - query (unbounded sides far outside any difference).
  const int shift = t.seq.len_k - t.seq.len_q, key_end = t.seq.len_k - key0;
  const int lowest_diff = p.window_left >= 0 ? shift - p.window_left : -(1 << 30);
  const int highest_diff = p.window_right >= 0 ? shift + p.window_right : (1 << 30);
  trace(TraceEvent::tile);
  if (t.steps > 0) cutlass::arch::ClusterTransactionBarrier::wait(&smem.kv_loaded, carry.kv_tiles & 1);
  if constexpr (Traits::kKeyValuesInRegisters) {
    if (t.steps > 0) {  // K_w and V_w into registers, for every step's S^T and dP^T
      load_a_fragment<typename Traits::SmemCopyKeyValue>(mma_sdp, thread, sKw, tSrK);
      load_a_fragment<typename Traits::SmemCopyKeyValue>(mma_sdp, thread, sVw, tdPrV);
    }
  }
  trace(TraceEvent::operands);

  // One step. kMasked: some (query, key) pair of the step is masked (by the window, or lying
  // past the sequence's end).
  auto run_step = [&](BackwardTile::Step step, auto masked) {
    constexpr bool kMasked = decltype(masked)::value;
    const int stage = state.index();
    const int row0 = step.m_block * kBlockM;

    Tensor acc_s = partition_fragment_C(mma_sdp, Shape<Int<kKeys>, Int<kBlockM>>{});
    Tensor acc_dp = partition_fragment_C(mma_sdp, Shape<Int<kKeys>, Int<kBlockM>>{});
    trace(TraceEvent::step);
    pipeline_q.consumer_wait(state);
    warpgroup_gemm<true>(mma_sdp, tSrK, tSrQ(_, _, _, stage), acc_s);
    pipeline_do.consumer_wait(state);
    warpgroup_gemm<true>(mma_sdp, tdPrV, tdPrdO(_, _, _, stage), acc_dp);

    auto lse_of = [&](int c) { return sLSE(stats_skip + get<1>(coords(0, c)), stage); };
    auto delta_of = [&](int c) { return sD(stats_skip + get<1>(coords(0, c)), stage); };
    // (common/mask.hpp) query i sees key j iff j < len_k and shift - window_left <= j - i <=
    // shift + window_right, each bound where its window is set; here in tile-local indices.
    auto visible = [&, query_end = t.seq.len_q - row0, lowest = lowest_diff + row0 - key0,
                    highest = highest_diff + row0 - key0](int r, int c) {
      const int query = get<1>(coords(r, c)), key = get<0>(coords(r, c)), diff = key - query;
      return query < query_end && key < key_end && diff >= lowest && diff <= highest;
    };
    step_gradients_of_scores<kMasked, kSoftcap, kDropout, kAlibi>(p, acc_s, acc_dp, coords, drop_coords, dropout_rng,
                                                                 lse_of, delta_of, visible, t.batch, step.head, key0,
                                                                 row0, shift);
    trace(TraceEvent::scores);

    Tensor p_t = convert_fragment<Element>(acc_s);    // P^T
    Tensor ds_t = convert_fragment<Element>(acc_dp);  // dS^T
    copy(store_ds, thr_store_ds.retile_S(ds_t), tdSsdS(_, _, _, stage));
    Tensor tdVrP = make_tensor(p_t.data(), gmma_accumulator_as_a_layout(p_t.layout()));
    warpgroup_gemm<false>(mma_dkv, tdVrP, tdVrdOt(_, _, _, stage), acc_dv);
    cutlass::arch::fence_view_async_shared();  // dS written by ordinary stores, read by wgmma
    if constexpr (kDqOverOwnKeys)
      NamedBarrier::sync(128, kBarrierOwnDsWritten0 + warp_group);
    else
      NamedBarrier::sync(Traits::kConsumerThreads, kBarrierDsWritten);
    trace(TraceEvent::ds_shared);

    Tensor acc_dq = partition_fragment_C(mma_dq, Shape<Int<kBlockM>, Int<Traits::kDqCols>>{});
    Tensor tdQrdS_stage = tdQrdS(_, _, _, stage);
    warpgroup_gemm<true>(mma_dq, tdQrdS_stage, tdQrKt, acc_dq);
    Tensor tdKrdS = make_tensor(ds_t.data(), gmma_accumulator_as_a_layout(ds_t.layout()));
    warpgroup_gemm<false>(mma_dkv, tdKrdS, tdKrQt(_, _, _, stage), acc_dk);
    warpgroup_wait<1>();  // dV and dQ done: dO is free
    pipeline_do.consumer_release(state);

    stage_dq<Traits>(smem, acc_dq, thread, warp_group);

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

  // Epilogue: dK = scale * sum dS^T Q, dV = sum P^T dO.
  Tensor out_coords = thr_dkv.partition_C(make_identity_tensor(Shape<Int<kKeys>, Int<kHeadDim>>{}));
  store_key_gradients<Traits>(p, t, acc_dk, out_coords, key0, 0, p.dk, p.dk_partial, p.scale);
  store_key_gradients<Traits>(p, t, acc_dv, out_coords, key0, 0, p.dv, p.dv_partial, 1.0f);
  trace(TraceEvent::stored);
}

}  // namespace flashattn::cuda::sm90
