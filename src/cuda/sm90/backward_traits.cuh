#pragma once
// Compile-time shape of the sm90 backward for one (dtype, head dim): tiles, warpgroup roles,
// the five wgmma GEMMs, shared-memory layouts and the TMA copies.
//
// Warpgroup 0 is the producer: warp 0 issues every TMA load; warp 1 adds each step's dQ into the
// fp32 accumulator in global memory (bulk reduce-add). Two consumer warpgroups compute, per
// query block of kBlockM rows, S^T, dP^T, P^T and dS^T, and the dK, dV and dQ GEMMs. Two
// arrangements, by head dim:
// - Up to 128 (keys split): one CTA owns kBlockN = 128 keys; warpgroup w owns 64 of them:
//     S^T  = K_w Q^T      dP^T = V_w dO^T          (SS: both operands in shared memory;
//                                                   RS at 64: K_w, V_w in registers)
//     dV_w += P^T dO      dK_w += dS^T Q             (RS: P^T, dS^T straight from registers)
//     dQ[:, half w] = dS K[:, half w]               (SS: dS through shared memory; 96, 128)
//     dQ_w = dS_w K_w, summed in the staging buffer  (SS; 64: kDqOverOwnKeys)
//   Computing S transposed puts P^T and dS^T in the registers where the dV and dK GEMMs want
//   their A operand; only dS goes through shared memory, once, for dQ.
// - 192 and 256 (head dim split): 64 keys x head dim of dK and dV no longer fit a warpgroup's
//   registers, so a CTA owns kBlockN = 64 keys and warpgroup w owns half of the head dim:
//     S^T_w = K Q_w^T     dP^T_w = V dO_w^T         (Q_w, dO_w: query rows 32w..32w+31)
//     P^T, dS^T of both warpgroups through shared memory, then
//     dV[:, half w] += P^T dO[:, half w]   dK[:, half w] += dS^T Q[:, half w]
//     dQ[:, half w]  = dS K[:, half w]                (all SS)
//   A step's fp32 dQ (64 KB at 256) has no staging buffer of its own beside two stages of Q and
//   dO: each consumer adds half of its part with reductions from registers (red.global.add.v4.f32)
//   and stages the other half in its half of the dO stage once its dV GEMM has read it, and warp 1
//   adds that half (bulk reduce-add). In deterministic mode they add in the dQ block's turn, which
//   warp 2 takes and warp 1 passes on, at 192 all of dQ from registers (backward_producer.cuh).
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/numeric_types.h>
#include <cutlass/pipeline/pipeline.hpp>

#include "cuda/sm90/api.hpp"             // backward_splits_head_dim
#include "cuda/sm90/forward_traits.cuh"  // smem_layout_atom

namespace flashattn::cuda::sm90 {

using namespace cute;

// Head dims with an sm90 backward.
constexpr bool backward_head_dim_supported(int head_dim) {
  return head_dim == 64 || head_dim == 96 || head_dim == 128 || head_dim == 192 || head_dim == 256;
}

template <class Element_, int kHeadDim_>
struct BackwardTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static_assert(backward_head_dim_supported(kHeadDim));

  static constexpr bool kSplitHeadDim = backward_splits_head_dim(kHeadDim);
  static constexpr int kBlockN = kSplitHeadDim ? 64 : 128;  // keys per CTA
  static constexpr int kBlockM = 64;                        // query rows per step
  static constexpr int kConsumerWarpGroups = 2;
  // A consumer warpgroup's share of S^T (keys x queries) and of dK/dV (keys x columns).
  static constexpr int kKeysPerWarpGroup = kSplitHeadDim ? kBlockN : kBlockN / kConsumerWarpGroups;
  static constexpr int kQueriesPerWarpGroup = kSplitHeadDim ? kBlockM / kConsumerWarpGroups : kBlockM;
  static constexpr int kDkvCols = kSplitHeadDim ? kHeadDim / kConsumerWarpGroups : kHeadDim;
  // dQ of a step. At d = 64 each warpgroup computes it over its own keys for every column, so
  // that no warpgroup waits for the other's dS (the barrier that kept the two in step) and one's
  // element-wise work can overlap the other's GEMMs; the two partial sums meet in the staging
  // buffer. Above 64 its registers (64 x head dim fp32) do not fit beside dK and dV, and each
  // warpgroup computes half of the columns over all keys of the CTA.
  static constexpr bool kDqOverOwnKeys = !kSplitHeadDim && kHeadDim <= 64;
  static constexpr int kDqCols = kDqOverOwnKeys ? kHeadDim : kHeadDim / kConsumerWarpGroups;  // per warpgroup
  static constexpr int kDqKeys = kDqOverOwnKeys ? kKeysPerWarpGroup : kBlockN;  // the dQ GEMM's depth
  static constexpr int kDqSlices = kHeadDim / kDqCols;  // column slices of a dQ block, a staging buffer each
  // Head dim split, deterministic mode: whether the consumers stage half of dQ for a bulk add, as in
  // the default mode, or add all of it from registers. Staging holds each dQ turn until the bulk add
  // is complete; at 256 it still paid (1.00-1.08x the speed, H100, 2026-11-27), at 192 it cost causal
  // rows at n <= 4k 6-7% (docs/kernels/sm90-backward.md).
  static constexpr bool kOrderedDqStaged = kSplitHeadDim && kHeadDim == 256;
  static_assert(kSplitHeadDim || kDqSlices == (kDqOverOwnKeys ? 1 : kConsumerWarpGroups));
  // Stages of Q (with LSE), dO (with D) and dS. A d = 64 step is short enough that the next
  // step's loads, issued when a stage frees, can land late with two; three fit its shared memory.
  static constexpr int kStages = kHeadDim <= 64 ? 3 : 2;
  static_assert(!kSplitHeadDim || kStages == 2, "dq_staged_barrier (backward_tile.cuh) counts two stages");
  static constexpr int kConsumerThreads = kConsumerWarpGroups * 128;
  static constexpr int kThreads = kConsumerThreads + 128;
  // setmaxnreg: 65536 / 384 threads gives 168 each at launch; the two producer warps need few.
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters = 240;
  static_assert((kProducerRegisters + kConsumerWarpGroups * kConsumerRegisters) * 128 <= 65536 / kThreads / 8 * 8 * kThreads,
                "setmaxnreg asks for more registers than the launch gives the CTA");

  // The GEMMs, each for one warpgroup.
  using TileShapeSdP = Shape<Int<kKeysPerWarpGroup>, Int<kQueriesPerWarpGroup>, Int<kHeadDim>>;  // S^T, dP^T
  using TileShapedKV = Shape<Int<kKeysPerWarpGroup>, Int<kDkvCols>, Int<kBlockM>>;               // dK, dV
  using TileShapedQ = Shape<Int<kBlockM>, Int<kDqCols>, Int<kDqKeys>>;                           // dQ
  // S^T and dP^T take K_w and V_w as A operands, the same for every step of a tile. At d = 64 they
  // are read into registers once per tile (ldmatrix, 16 registers each), so that these GEMMs read
  // only Q and dO from shared memory: an SS wgmma m64n64k16 reads 128 bytes a cycle at the tensor
  // cores' peak, all that shared memory serves, an RS one 64. Above 64 they do not fit beside dK and dV.
  static constexpr bool kKeyValuesInRegisters = !kSplitHeadDim && kHeadDim <= 64;
  using MmaSdP = decltype(make_tiled_mma(k_major_op_selector<Element, TileShapeSdP, kKeyValuesInRegisters>()));
  using SmemCopyKeyValue = Copy_Atom<SM75_U32x4_LDSM_N, Element>;  // K_w, V_w rows -> the A fragment
  // dK/dV: P^T and dS^T from registers (keys split) or from shared memory (head dim split).
  static auto dkv_op() {
    if constexpr (kSplitHeadDim)
      return GMMA::ss_op_selector<Element, Element, float, TileShapedKV, GMMA::Major::K, GMMA::Major::MN>();
    else
      return GMMA::rs_op_selector<Element, Element, float, TileShapedKV, GMMA::Major::K, GMMA::Major::MN>();
  }
  using MmadKV = decltype(make_tiled_mma(dkv_op()));
  using MmadQ = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, TileShapedQ, GMMA::Major::MN, GMMA::Major::MN>()));
  static_assert(decltype(size<1>(typename MmaSdP::AtomShape_MNK{}))::value == kQueriesPerWarpGroup);
  static_assert(decltype(size<1>(typename MmadKV::AtomShape_MNK{}))::value == kDkvCols);
  static_assert(decltype(size<1>(typename MmadQ::AtomShape_MNK{}))::value == kDqCols);

  // Shared memory. Q, dO, K and V are stored as in global memory (head dim contiguous). Q and dO
  // serve as K-major B operands (S^T, dP^T) and, viewed transposed, as MN-major B operands (dK,
  // dV); K as a K-major A operand (S^T) and, transposed, as the MN-major B of the dQ GEMMs, whose
  // halves of the head dim must each start on a swizzle atom: hence K's atom follows kDqCols, and
  // Q's and dO's follow kDkvCols (the head-dim-split dK/dV GEMMs read their halves).
  using LayoutAtomQ = decltype(smem_layout_atom<Element, kDkvCols, GMMA::Major::K>());
  using SmemLayoutQ = decltype(tile_to_shape(LayoutAtomQ{}, Shape<Int<kBlockM>, Int<kHeadDim>, Int<kStages>>{}));
  using SmemLayoutdO = SmemLayoutQ;
  using SmemLayoutQt = decltype(composition(
      SmemLayoutQ{}, make_layout(Shape<Int<kHeadDim>, Int<kBlockM>, Int<kStages>>{},
                                 Stride<Int<kBlockM>, _1, Int<kBlockM * kHeadDim>>{})));
  using SmemLayoutK = decltype(tile_to_shape(smem_layout_atom<Element, kDqCols, GMMA::Major::K>(),
                                             Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  using SmemLayoutKt = decltype(composition(
      SmemLayoutK{}, make_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, Stride<Int<kBlockN>, _1>{})));
  using SmemLayoutV = decltype(tile_to_shape(LayoutAtomQ{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  // dS, (query, key) with the queries contiguous: the consumers write dS^T from their S^T
  // fragment with 16-byte rows along the queries (stmatrix), and the dQ GEMM reads dS as an
  // MN-major A operand.
  using SmemLayoutdS = decltype(tile_to_shape(smem_layout_atom<Element, kBlockM, GMMA::Major::MN>(),
                                              Shape<Int<kBlockM>, Int<kBlockN>, Int<kStages>>{}));
  using SmemLayoutdSt = decltype(composition(
      SmemLayoutdS{}, make_layout(Shape<Int<kBlockN>, Int<kBlockM>, Int<kStages>>{},
                                  Stride<Int<kBlockM>, _1, Int<kBlockM * kBlockN>>{})));
  using StoredS = Copy_Atom<SM90_U32x4_STSM_N, Element>;
  // Head dim split only: P^T in the same layout as dS, for the dV GEMM (keys split: 1 element).
  static constexpr int kPtElems = kSplitHeadDim ? int(cosize_v<SmemLayoutdS>) : 1;
  // Per query block: LSE * log2(e) and D = rowsum(dO * O), fp32. TMA starts a box only on a
  // 16-byte boundary of its innermost dimension, and a query block's first row is one only when
  // its sequence's is: each stage holds kStatRows rows from the 4-row boundary at or before the
  // block's first row (the block's rows start (first row mod 4) rows in), stages 512 bytes apart.
  static constexpr int kStatRows = kBlockM + 4;
  using SmemLayoutRowStats = Layout<Shape<Int<kStatRows>, Int<kStages>>, Stride<_1, Int<128>>>;
  static_assert(kStatRows <= 128);
  // One step's dQ of each warpgroup, fp32, in the order of its accumulator fragment (thread t's
  // i-th group of 4 values at (i * 128 + t) * 4): 16-byte stores without bank conflicts, and the
  // same order in the global accumulator, which backward_dq_convert.cuh reads back.
  // With kDqOverOwnKeys one buffer holds the step's whole block: warpgroup 0 stores its partial
  // sum, warpgroup 1 adds its own to it.
  static constexpr int kDqElems = kBlockM * kDqCols;  // per column slice
  static_assert(kDqElems % (128 * 4) == 0);
  static constexpr int kDqStagedElems = kSplitHeadDim ? 4 : kDqSlices * kDqElems;
  // Head dim split, default mode: consumer warpgroup w stages half of its part of a step's dQ
  // (fp32, the accumulator's fragment order) in its column half of the step's dO stage, which only
  // its own dV GEMM reads, once it has: kBlockM x kDkvCols elements, one contiguous range of the
  // stage, holding kDqElems / 2 floats.
  static constexpr int kStageElems = kBlockM * kHeadDim;
  static constexpr int kHalfStageElems = kBlockM * kDkvCols;
  static_assert(!kSplitHeadDim || kHalfStageElems * int(sizeof(Element)) * 2 == kDqElems * int(sizeof(float)));
  static_assert(!kSplitHeadDim || (SmemLayoutdO{}(0, kDkvCols, 0) == kHalfStageElems &&
                                   SmemLayoutdO{}(kBlockM - 1, kDkvCols - 1, 0) < kHalfStageElems &&
                                   SmemLayoutdO{}(0, 0, 1) == kStageElems));
  static CUTE_DEVICE float* dq_staging(Element* dout_stages, int stage, int w) {
    return reinterpret_cast<float*>(dout_stages + stage * kStageElems + w * kHalfStageElems);
  }

  using PipelineQ = cutlass::PipelineTmaAsync<kStages>;   // Q and its LSE rows
  using PipelinedO = cutlass::PipelineTmaAsync<kStages>;  // dO and its D rows
  using PipelineTile = cutlass::PipelineAsync<2>;          // tile indices, producer warp -> the others
  // The consumers and the producer's warp 1 (the dQ writer, which at 192 and 256 in deterministic
  // mode also passes the dQ turns); the deterministic kernels at 192 and 256 add warp 2, the turn
  // taker (backward_kernel.cuh).
  static constexpr int kTileReaders = kConsumerThreads + 32;

  struct SharedStorage {
    cute::array_aligned<Element, cosize_v<SmemLayoutK>, 1024> k;
    cute::array_aligned<Element, cosize_v<SmemLayoutV>, 1024> v;
    cute::array_aligned<Element, cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cosize_v<SmemLayoutdO>, 1024> dout;
    cute::array_aligned<Element, cosize_v<SmemLayoutdS>, 1024> ds;
    cute::array_aligned<Element, kPtElems, (kSplitHeadDim ? 1024 : 16)> pt;
    cute::array_aligned<float, kDqStagedElems, 128> dq;
    cute::array_aligned<float, cosize_v<SmemLayoutRowStats>, 128> lse;
    cute::array_aligned<float, cosize_v<SmemLayoutRowStats>, 128> delta;
    typename PipelineQ::SharedStorage pipeline_q;
    typename PipelinedO::SharedStorage pipeline_do;
    typename PipelineTile::SharedStorage pipeline_tile;
    int tile_slot[2];
    uint64_t kv_loaded;  // K and V of the tile have landed (transaction barrier)
    uint64_t kv_free;    // the consumers are done reading them (one arrival per consumer thread)
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per CTA");

  static constexpr uint32_t kRowStatBytes = kStatRows * sizeof(float);
  static constexpr uint32_t kQueryBytes = kBlockM * kHeadDim * sizeof(Element) + kRowStatBytes;
  static constexpr uint32_t kKeyValueBytes = 2 * kBlockN * kHeadDim * sizeof(Element);

  // Global tensors as TMA sees them: (rows, head dim, heads, batch); row statistics (rows, heads).
  using GmemShape = Shape<int32_t, Int<kHeadDim>, int32_t, int32_t>;
  using GmemStride = Stride<int64_t, _1, int64_t, int64_t>;
  using GmemTensor = decltype(make_tensor(make_gmem_ptr(static_cast<Element const*>(nullptr)),
                                          Layout<GmemShape, GmemStride>{}));
  using StatsShape = Shape<int32_t, int32_t>;
  using StatsStride = Stride<_1, int64_t>;
  using StatsTensor = decltype(make_tensor(make_gmem_ptr(static_cast<float const*>(nullptr)),
                                           Layout<StatsShape, StatsStride>{}));
  using TmaLoadQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, take<0, 2>(SmemLayoutQ{}),
                                          Shape<Int<kBlockM>, Int<kHeadDim>>{}, _1{}));
  using TmaLoadK = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, SmemLayoutK{},
                                          Shape<Int<kBlockN>, Int<kHeadDim>>{}, _1{}));
  using TmaLoadV = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, SmemLayoutV{},
                                          Shape<Int<kBlockN>, Int<kHeadDim>>{}, _1{}));
  using TmaLoadStats = decltype(make_tma_copy(SM90_TMA_LOAD{}, StatsTensor{},
                                              Layout<Shape<Int<kStatRows>>>{}, Shape<Int<kStatRows>>{}, _1{}));
};

}  // namespace flashattn::cuda::sm90
