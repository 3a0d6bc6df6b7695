#pragma once
// Compile-time shape of the sm90 forward for one (dtype, head dim): tiles, warpgroup roles,
// shared-memory layouts, the two wgmma GEMMs and the TMA copies.
//
// One CTA: a producer warpgroup (one warp issues every TMA load) and two or three consumer
// warpgroups, each owning 64 of the kBlockM query rows of a tile. The consumers read the same
// K/V stages; they take turns issuing their GEMMs so that the others' softmax runs under one's
// tensor-core work.
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/numeric_types.h>
#include <cutlass/pipeline/pipeline.hpp>

#include "cuda/sm90/forward_heuristics.hpp"
#include "cuda/sm90/forward_tile.cuh"
#include "cuda/sm90/gmma_fragment.cuh"

namespace flashattn::cuda::sm90 {

using namespace cute;

// The widest swizzle (128, 64 or 32 bytes) that divides a row of `kCols` elements.
template <class Element, int kCols, GMMA::Major kMajor>
auto smem_layout_atom() {
  constexpr int kRowBytes = kCols * int(sizeof(Element));
  if constexpr (kRowBytes % 128 == 0)
    return GMMA::Layout_SW128_Atom<Element, kMajor>{};
  else if constexpr (kRowBytes % 64 == 0)
    return GMMA::Layout_SW64_Atom<Element, kMajor>{};
  else
    return GMMA::Layout_SW32_Atom<Element, kMajor>{};
}

// kBlockM_: query rows per tile, 64 per consumer warpgroup: 128, or 192 up to head dim 64
// (forward_heuristics.hpp picks per problem). Element_: Q, K and V; OutputElement_: O, the same
// except for FP8 (e4m3) inputs, whose output is f16 or bf16 (docs/kernels/fp8-forward.md).
// kPagedKv_: the traits of the kernel over paged K/V (forward_paged_kv.cuh), whose stages differ
// in the order of their swizzle atoms (below); `Paged` names them from the others.
// kTransposeValue_ (FP8): V^T written in the kernel (fp8_value_transposer.cuh) instead of by the
// launch's pre-pass (fp8_value_transpose.cuh); `TransposingValue` names them from the others.
template <class Element_, int kHeadDim_, int kBlockM_ = 128, class OutputElement_ = Element_, bool kPagedKv_ = false,
          bool kTransposeValue_ = false>
struct ForwardTraits {
  using Element = Element_;
  using OutputElement = OutputElement_;
  static constexpr int kHeadDim = kHeadDim_;
  static_assert(kHeadDim % 16 == 0 && kHeadDim <= 256);
  static constexpr bool kPagedKv = kPagedKv_;
  using Paged = ForwardTraits<Element_, kHeadDim_, kBlockM_, OutputElement_, true>;
  using TransposingValue = ForwardTraits<Element_, kHeadDim_, kBlockM_, OutputElement_, false, true>;
  // FP8: both operands of every wgmma K-major, so the P.V GEMM reads V^T, which the launch
  // writes (fp8_value_transpose.cuh) and TMA loads as (head dim, keys) tiles, or, with
  // kTransposeValue, the producer warpgroup's other three warps write from V's rows
  // (fp8_value_transposer.cuh); P goes to e4m3 in registers (fp8_probabilities.cuh); Q stays in
  // shared memory.
  static constexpr bool kFp8 = sizeof(Element) == 1;
  static constexpr bool kTransposeValue = kTransposeValue_;
  static_assert(!kFp8 || sizeof(OutputElement) == 2, "FP8: 16-bit output");
  static_assert(!kFp8 || !kPagedKv, "FP8 reads contiguous K/V only");
  static_assert(!kTransposeValue || kFp8, "V^T is written in the kernel for FP8 only");

  // Tiles. K/V tiles shrink with the head dim so that two stages of each, Q and (for head
  // dims up to 128) a second Q stage and a separate output tile fit in the 227 KB of shared memory, and so that the
  // consumers' S, P and O fragments fit their registers without spilling. Up to d = 64 a
  // warpgroup's two GEMMs are too short to cover another's softmax (which costs the same at
  // every head dim): three consumer warpgroups (192 rows) give each softmax two turns' time.
  static constexpr int kBlockM = kBlockM_;
  static_assert(kBlockM == 128 || (kBlockM == 192 && tall_tiles_fit(kHeadDim, kFp8)),
                "three warpgroups' fragments fit only up to d = 64 (FP8: 128, with the serial mainloop)");
  // FP8 at d = 65-128 with three warpgroups: each warpgroup runs its key blocks one after the other
  // (kSerialMainloop: S, its softmax, P.V, complete before the next S, instead of the next S in
  // flight beside P), so that O, S and the softmax state fit 160 registers with 128-key blocks
  // (ptxas: 88 bytes of spill stores, ~15 local loads and stores per iteration of ~1450
  // instructions); the other two warpgroups' GEMMs run under its softmax. With the overlap kept,
  // 128 keys spilled 216 bytes and 96-key blocks ran -5% to +2% (docs/kernels/fp8-forward.md).
  static constexpr bool kSerialMainloop = kFp8 && kBlockM == 192 && kHeadDim > 64;
  static constexpr int kBlockN = kFp8 ? fp8_key_block_cols(kHeadDim, kBlockM) : key_block_cols(kHeadDim);
  static constexpr int kStages = 2;
  // Above 128 there is room for neither a separate output tile nor a second Q stage: each
  // consumer warpgroup stages its output in a K/V stage the tile read last (warpgroup 0 in the
  // last K stage, warpgroup 1 in the last V stage), so that Q is free after the last QK^T and
  // the next tile's Q loads while this one's last P.V and epilogue run.
  static constexpr bool kOutputInKVStages = kHeadDim > 128;
  static constexpr int kKeyStageKeeper = 0, kValueStageKeeper = 1;  // the warpgroups that keep them
  // Up to 128, Q is double-buffered: the next tile's Q loads while this one's runs, so a
  // consumer warpgroup starts its next tile as soon as its epilogue is issued.
  static constexpr int kQueryStages = kOutputInKVStages ? 1 : 2;

  // Roles and registers (setmaxnreg). The launch gives every thread 65536 / kThreads rounded
  // down to 8 (168 with two consumer warpgroups, 128 with three); the roles share that pool.
  // Two warpgroups: up to d = 192 the consumers' fragments fit 232, which leaves the producer 40
  // and no spills anywhere (with 24 the producer spilled: docs/log/sm90-forward.md, the register
  // split and the spills gone); at d = 256 the output fragment needs 240 (with 232 the mainloop
  // spills) and the producer gets 24.
  // Three: 160 and 32 (FP8 at d = 128 too, with the serial mainloop).
  static constexpr int kRowsPerWarpGroup = 64;
  static constexpr int kConsumerWarpGroups = kBlockM / kRowsPerWarpGroup;
  static_assert(kBlockM % kRowsPerWarpGroup == 0 && (kConsumerWarpGroups == 2 || kConsumerWarpGroups == 3));
  // The last partial wave's tiles dealt out as units of key blocks (forward_tail_split.cuh):
  // where the output has shared memory of its own, and with two consumer warpgroups (with three,
  // at 160 registers, the merge made ptxas spill 120 bytes, some inside the mainloop).
  static constexpr bool kTailSplit = !kOutputInKVStages && kConsumerWarpGroups == 2;
  static constexpr int kConsumerThreads = kConsumerWarpGroups * 128;
  static constexpr int kThreads = kConsumerThreads + 128;
  // The producer warpgroup's other three warps have work where V does not arrive by the producer
  // warp's TMA alone: paged V's loader (forward_paged_kv.cuh) and FP8 V's transposer
  // (fp8_value_transposer.cuh). They follow the published work items as the consumers do.
  static constexpr bool kValueWarps = kPagedKv || kTransposeValue;
  static constexpr int kValueWarpThreads = 96;
  static constexpr int kConsumerRegisters = kConsumerWarpGroups == 3 ? 160 : kHeadDim <= 192 ? 232 : 240;
  static constexpr int kProducerRegisters = kConsumerWarpGroups == 3 ? 32 : kHeadDim <= 192 ? 40 : 24;
  static_assert((kProducerRegisters + kConsumerWarpGroups * kConsumerRegisters) * 128 <= 65536 / kThreads / 8 * 8 * kThreads,
                "setmaxnreg asks for more registers than the launch gives the CTA");

  using TileShapeQK = Shape<Int<kBlockM>, Int<kBlockN>, Int<kHeadDim>>;  // S = Q K^T
  using TileShapePV = Shape<Int<kBlockM>, Int<kHeadDim>, Int<kBlockN>>;  // O = P V
  using ConsumerLayout = Layout<Shape<Int<kConsumerWarpGroups>, _1, _1>>;
  // Q in registers: each warpgroup reads its 64 Q rows from shared memory once per tile
  // (ldmatrix) and every QK^T of the tile takes them from registers, so the key blocks' GEMMs
  // read only K from shared memory; Q's stage is free as soon as the rows are read. Sustained
  // (at the power cap) d = 128 gained 1.0-1.4% at n = 4k-16k, per call no change
  // (docs/log/sm90-forward.md, Q in registers). Not with three warpgroups, whose 160 registers
  // it overflows (168 bytes of spills at d = 64).
  static constexpr bool kQueryInRegisters =
      kHeadDim <= FLASHATTN_SM90_Q_IN_REGISTERS_UP_TO && kConsumerWarpGroups == 2 && !kFp8;
  using TiledMmaQK = decltype(make_tiled_mma(k_major_op_selector<Element, TileShapeQK, kQueryInRegisters>(),
                                              ConsumerLayout{}));
  using SmemCopyQ = Copy_Atom<SM75_U32x4_LDSM_N, Element>;  // Q rows -> the A fragment
  static constexpr GMMA::Major kValueMajor = kFp8 ? GMMA::Major::K : GMMA::Major::MN;  // V^T as B
  using TiledMmaPV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, TileShapePV, GMMA::Major::K, kValueMajor>(), ConsumerLayout{}));
  // One wgmma instruction spans the whole key block (S) and the whole head dim (O).
  static_assert(decltype(size<1>(typename TiledMmaQK::AtomShape_MNK{}))::value == kBlockN);
  static_assert(decltype(size<1>(typename TiledMmaPV::AtomShape_MNK{}))::value == kHeadDim);

  // Shared memory. Q, K and O are K-major (head dim contiguous, as in global memory). 16-bit V
  // is stored the same way and read by the P.V GEMM as V^T, an MN-major B operand; FP8 V^T
  // arrives transposed, keys contiguous (K-major), or, with kTransposeValue, V arrives in stages
  // of rows laid out as K's (v_rows), from which the transposer writes the V^T stages.
  // A swizzle atom is 8 rows (keys) x 128 bytes of the head dim. K's and V's stages order their
  // atoms along the keys first, so that 64 columns of a block are one run (a TMA box of the
  // contiguous kernel); with kPageBoxes (paged, head dims 128, 192 and 256) along the head dim
  // first, so that a page's 16 keys x the whole head dim are one run, which one 5-D TMA box fills
  // (page_box_maps.cuh). wgmma reads either order (the descriptors' two strides). At head dim 64
  // a page is one atom column, one box either way; 64-byte atoms (head dims 32 and 96) keep the
  // keys-first order and CuTe's boxes (one box a page there is not measured).
  static constexpr bool kPageBoxes =
      kPagedKv && kHeadDim * sizeof(Element) % 128 == 0 && kHeadDim * sizeof(Element) > 128;
  using RowAtom = decltype(smem_layout_atom<Element, kHeadDim, GMMA::Major::K>());
  using SmemLayoutQ =
      decltype(tile_to_shape(RowAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>, Int<kQueryStages>>{}));
  using AtomsAlongKeys = Step<_1, _2, _3>;  // over (key, head dim, stage): which mode's atoms come first
  using AtomsAlongHeadDim = Step<_2, _1, _3>;
  using SmemLayoutK = decltype(tile_to_shape(RowAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>, Int<kStages>>{},
                                             std::conditional_t<kPageBoxes, AtomsAlongHeadDim, AtomsAlongKeys>{}));
  using SmemLayoutVt = std::conditional_t<
      kFp8,
      decltype(tile_to_shape(smem_layout_atom<Element, kBlockN, GMMA::Major::K>(),
                             Shape<Int<kHeadDim>, Int<kBlockN>, Int<kStages>>{})),
      decltype(tile_to_shape(smem_layout_atom<Element, kHeadDim, GMMA::Major::MN>(),
                             Shape<Int<kHeadDim>, Int<kBlockN>, Int<kStages>>{},  // (head dim, key, stage): the
                             std::conditional_t<kPageBoxes, Step<_1, _2, _3>, Step<_2, _1, _3>>{}))>;  // same orders
  // What the TMA load of V fills: FP8, V^T itself, or V's rows (v_rows) with kTransposeValue;
  // else the GEMM's stages, the same bytes as (key, head dim, stage).
  using SmemLayoutV = std::conditional_t<
      kTransposeValue, SmemLayoutK,
      std::conditional_t<kFp8, SmemLayoutVt,
                         decltype(composition(SmemLayoutVt{},
                                              make_ordered_layout(Shape<Int<kBlockN>, Int<kHeadDim>, Int<kStages>>{},
                                                                  Step<_2, _1, _3>{})))>>;
  // One consumer warpgroup's part of the output tile, (64 rows, head dim): each warpgroup
  // stores its part on its own, with no barrier between them.
  using SmemLayoutO = decltype(tile_to_shape(smem_layout_atom<OutputElement, kHeadDim, GMMA::Major::K>(),
                                             Shape<Int<kRowsPerWarpGroup>, Int<kHeadDim>>{}));
  static constexpr int kOutputElems = cosize_v<SmemLayoutO>;
  static constexpr int kStageElems = kBlockN * kHeadDim;  // one K or V stage
  static_assert(cosize_v<SmemLayoutK> == kStages * kStageElems && cosize_v<SmemLayoutV> == kStages * kStageElems &&
                    cosize_v<SmemLayoutVt> == kStages * kStageElems,
                "K and V stages are contiguous");
  static_assert(!kOutputInKVStages || (kOutputElems * sizeof(OutputElement) <= kStageElems * sizeof(Element) &&
                                       kConsumerWarpGroups == 2 && kStageElems * sizeof(Element) % 1024 == 0),
                "a warpgroup's output fits in one K/V stage, at the swizzle's alignment");
  // The P.V GEMM of one warpgroup: its accumulator fragment is the one the epilogue stores.
  using WarpGroupMmaPV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<Int<kRowsPerWarpGroup>, Int<kHeadDim>, Int<kBlockN>>,
                           GMMA::Major::K, kValueMajor>()));

  using PipelineQ = cutlass::PipelineTmaAsync<kQueryStages>;
  using PipelineK = cutlass::PipelineTmaAsync<kStages>;
  using PipelineV = cutlass::PipelineTmaAsync<kStages>;
  using PipelineTile = cutlass::PipelineAsync<2>;  // tile slots, producer -> consumers

  struct Empty {};
  struct SharedStorage {
    cute::array_aligned<Element, cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cosize_v<SmemLayoutK>, 1024> k;
    cute::array_aligned<Element, cosize_v<SmemLayoutVt>, 1024> v;  // what the P.V GEMM reads
    std::conditional_t<kOutputInKVStages, Empty,
                       cute::array_aligned<OutputElement, kConsumerWarpGroups * kOutputElems, 1024>> o;
    typename PipelineQ::SharedStorage pipeline_q;
    typename PipelineK::SharedStorage pipeline_k;
    typename PipelineV::SharedStorage pipeline_v;
    typename PipelineTile::SharedStorage pipeline_tile;
    TileSlot tile_slot[2];
    int tail_arrived[kConsumerWarpGroups];  // forward_tail_split.cuh
    // kTransposeValue: V's rows as TMA loads them, and their pipeline (producer warp ->
    // transposer). Last, so that the other kernels' layout is as it was.
    std::conditional_t<kTransposeValue, typename PipelineV::SharedStorage, Empty> pipeline_v_rows;
    std::conditional_t<kTransposeValue, cute::array_aligned<Element, cosize_v<SmemLayoutV>, 1024>, Empty> v_rows;
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per CTA");

  static constexpr uint32_t kQueryBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kKeyBytes = kBlockN * kHeadDim * sizeof(Element);

  // Global tensors as TMA sees them: (rows, head dim, heads, batch), strides in elements. The
  // head dim is the problem's (at most kHeadDim): TMA zero-fills the columns of a box past it
  // on load and clips them on store (api.hpp: supports_forward).
  using GmemShape = Shape<int32_t, int32_t, int32_t, int32_t>;
  using GmemStride = Stride<int64_t, _1, int64_t, int64_t>;
  using GmemLayout = Layout<GmemShape, GmemStride>;
  using GmemTensor = decltype(make_tensor(make_gmem_ptr(static_cast<Element const*>(nullptr)), GmemLayout{}));
  using GmemTensorOut = decltype(make_tensor(make_gmem_ptr(static_cast<OutputElement*>(nullptr)), GmemLayout{}));
  using TmaLoadQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, take<0, 2>(SmemLayoutQ{}),
                                          Shape<Int<kBlockM>, Int<kHeadDim>>{}, _1{}));
  using TmaLoadK = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, take<0, 2>(SmemLayoutK{}),
                                          Shape<Int<kBlockN>, Int<kHeadDim>>{}, _1{}));
  // FP8 with the pre-pass: V^T as (head dim, keys, heads, batch), keys contiguous.
  using ValueBox = std::conditional_t<kFp8 && !kTransposeValue, Shape<Int<kHeadDim>, Int<kBlockN>>,
                                      Shape<Int<kBlockN>, Int<kHeadDim>>>;
  using TmaLoadV = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, take<0, 2>(SmemLayoutV{}), ValueBox{}, _1{}));
  using TmaStoreO = decltype(make_tma_copy(SM90_TMA_STORE{}, GmemTensorOut{}, SmemLayoutO{},
                                           Shape<Int<kRowsPerWarpGroup>, Int<kHeadDim>>{}, _1{}));

  // Paged K/V (16-bit only; forward_paged_kv.cuh): a key block of K is loaded as boxes of
  // kPageRows keys, each from its own page, over the page pool seen as (row in page, head dim,
  // heads, page); every page size is a multiple of kPageRows, so a box never spans two pages. V is
  // loaded in rows by the producer warpgroup's other three warps.
  static constexpr int kPageRows = 16;
  static_assert(kBlockN % kPageRows == 0, "key blocks of whole page boxes");
  static constexpr uint32_t kPageBytes = kPageRows * kHeadDim * sizeof(Element);  // one page box
  using PageBox = Shape<Int<kPageRows>, Int<kHeadDim>>;
  template <class StageLayout>
  using PageBoxLayout = decltype(take<0, 2>(flat_divide(take<0, 2>(StageLayout{}), PageBox{})));
  using TmaLoadKPage = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, PageBoxLayout<SmemLayoutK>{}, PageBox{}, _1{}));
};

}  // namespace flashattn::cuda::sm90
