#pragma once
// Compile-time shape of one sm80 forward kernel: tile sizes, warps, the mma atom, shared-memory
// layouts and the copy atoms that move tiles between global, shared and register memory.
#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

namespace flashattn::cuda::sm80 {

template <class Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kWarps_>
struct ForwardTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;  // query rows per CTA
  static constexpr int kBlockN = kBlockN_;  // keys per tile
  static constexpr int kWarps = kWarps_;
  static constexpr int kThreads = kWarps * 32;
  static_assert(std::is_same_v<Element, cutlass::half_t> || std::is_same_v<Element, cutlass::bfloat16_t>);
  static_assert(kHeadDim % 32 == 0, "head dim: a multiple of 32");
  // Split-Q: each warp owns whole 16-row slices of the query tile, so the softmax needs no
  // communication between warps.
  static_assert(kBlockM % (16 * kWarps) == 0, "query rows: whole 16-row slices per warp");
  static_assert(kBlockN % 16 == 0);

  // fp32 accumulation of 16x8x16 tensor-core mmas.
  using MmaOp = std::conditional_t<std::is_same_v<Element, cutlass::half_t>,
                                   cute::SM80_16x8x16_F32F16F16F32_TN,
                                   cute::SM80_16x8x16_F32BF16BF16F32_TN>;
  using TiledMma = cute::TiledMMA<cute::MMA_Atom<MmaOp>,
                                  cute::Layout<cute::Shape<cute::Int<kWarps>, cute::_1, cute::_1>>,
                                  cute::Tile<cute::Int<16 * kWarps>, cute::_16, cute::_16>>;

  // Shared memory: rows of kSmemRowElems elements in 8-row atoms, XOR-swizzled in 16-byte units
  // so that both the 16-byte cp.async stores and the ldmatrix reads are bank-conflict free.
  static constexpr int kSmemRowElems = kHeadDim % 64 == 0 ? 64 : 32;
  static constexpr int kSwizzleBits = kSmemRowElems == 64 ? 3 : 2;
  using SmemAtom = decltype(cute::composition(
      cute::Swizzle<kSwizzleBits, 3, 3>{},
      cute::Layout<cute::Shape<cute::_8, cute::Int<kSmemRowElems>>,
                   cute::Stride<cute::Int<kSmemRowElems>, cute::_1>>{}));
  using SmemLayoutQ = decltype(cute::tile_to_shape(
      SmemAtom{}, cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDim>>{}));
  using SmemLayoutKV = decltype(cute::tile_to_shape(
      SmemAtom{}, cute::Shape<cute::Int<kBlockN>, cute::Int<kHeadDim>>{}));
  // V as the B operand of P.V: the (head dim, key) view of the same bytes.
  using SmemLayoutVt = decltype(cute::composition(
      SmemLayoutKV{},
      cute::make_layout(cute::Shape<cute::Int<kHeadDim>, cute::Int<kBlockN>>{}, cute::GenRowMajor{})));

  static constexpr int kSmemQElems = kBlockM * kHeadDim;  // also holds O for the epilogue
  static constexpr int kSmemKVElems = kBlockN * kHeadDim;
  static constexpr int kSmemBytes = (kSmemQElems + 2 * kSmemKVElems) * int(sizeof(Element));

  // shared -> registers: ldmatrix (transposed for V).
  using SmemCopyAtom = cute::Copy_Atom<cute::SM75_U32x4_LDSM_N, Element>;
  using SmemCopyAtomTransposed = cute::Copy_Atom<cute::SM75_U16x8_LDSM_T, Element>;
  // registers -> shared for the output tile: pairs of elements.
  using SmemCopyAtomO = cute::Copy_Atom<cute::AutoVectorizingCopyWithAssumedAlignment<32>, Element>;

  // global <-> shared: 16 bytes per thread per copy, a row segment of kSmemRowElems elements
  // per group of threads. Used to partition tiles; the copies themselves are issued by hand
  // (cp.async with zero-fill, or vector stores) because rows are gathered per row.
  static constexpr int kVectorElems = 16 / int(sizeof(Element));
  static constexpr int kThreadsPerRow = kSmemRowElems / kVectorElems;
  static_assert(kThreads % kThreadsPerRow == 0);
  using GmemThreadLayout =
      cute::Layout<cute::Shape<cute::Int<kThreads / kThreadsPerRow>, cute::Int<kThreadsPerRow>>,
                   cute::Stride<cute::Int<kThreadsPerRow>, cute::_1>>;
  using GmemTiledCopy = decltype(cute::make_tiled_copy(
      cute::Copy_Atom<cute::UniversalCopy<cute::uint128_t>, Element>{}, GmemThreadLayout{},
      cute::Layout<cute::Shape<cute::_1, cute::Int<kVectorElems>>>{}));
  static_assert(kBlockM % (kThreads / kThreadsPerRow) == 0);
  static_assert(kBlockN % (kThreads / kThreadsPerRow) == 0);
};

}  // namespace flashattn::cuda::sm80
