#pragma once
// The CuTe types of the sm80 backward for one (dtype, head dim): tiled MMAs, shared-memory
// layouts (and their transposed views for the GEMMs that read a tile transposed), copy atoms.
#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include "cuda/sm80/backward_config.cuh"

namespace flashattn::cuda::sm80 {

template <class Element>
using Sm80MmaAtom = cute::MMA_Atom<std::conditional_t<std::is_same_v<Element, cutlass::half_t>,
                                                      cute::SM80_16x8x16_F32F16F16F32_TN,
                                                      cute::SM80_16x8x16_F32BF16BF16F32_TN>>;

// Warps tiled WarpsM x WarpsN over the output; each warp covers 16 x 16 per step, so that
// 4-matrix ldmatrix loads feed both operands.
template <class Element, int WarpsM, int WarpsN>
using WarpGridMma =
    cute::TiledMMA<Sm80MmaAtom<Element>, cute::Layout<cute::Shape<cute::Int<WarpsM>, cute::Int<WarpsN>, cute::_1>>,
                   cute::Tile<cute::Int<16 * WarpsM>, cute::Int<16 * WarpsN>, cute::_16>>;

// Width of the swizzle atom of a shared tile whose rows hold `Cols` 16-bit elements: 64
// elements (128 bytes, Swizzle<3,3,3>) where it divides the row, else 32 (Swizzle<2,3,3>).
// Either way 16-byte cp.async writes and ldmatrix reads of 8 rows are free of bank conflicts.
template <int Cols>
constexpr int kSwizzleWidth = Cols % 64 == 0 ? 64 : 32;

template <int Cols>
using SwizzleAtom = decltype(cute::composition(
    cute::Swizzle<kSwizzleWidth<Cols> == 64 ? 3 : 2, 3, 3>{},
    cute::Layout<cute::Shape<cute::_8, cute::Int<kSwizzleWidth<Cols>>>,
                 cute::Stride<cute::Int<kSwizzleWidth<Cols>>, cute::_1>>{}));

// A (Rows x Cols) row-major shared tile, optionally with a trailing stage mode.
template <int Rows, int Cols>
using SmemTile = decltype(cute::tile_to_shape(SwizzleAtom<Cols>{},
                                              cute::Shape<cute::Int<Rows>, cute::Int<Cols>>{}));
template <int Rows, int Cols, int Stages>
using SmemTileStaged = decltype(cute::tile_to_shape(
    SwizzleAtom<Cols>{}, cute::Shape<cute::Int<Rows>, cute::Int<Cols>, cute::Int<Stages>>{}));

// The same memory seen as its transpose (Cols x Rows): element (c, r) is element (r, c).
template <class Tile, int Rows, int Cols>
using TransposedTile = decltype(cute::composition(
    Tile{}, cute::make_layout(cute::Shape<cute::Int<Cols>, cute::Int<Rows>>{}, cute::GenRowMajor{})));
template <class Tile, int Rows, int Cols, int Stages>
using TransposedTileStaged = decltype(cute::composition(
    Tile{}, cute::Layout<cute::Shape<cute::Int<Cols>, cute::Int<Rows>, cute::Int<Stages>>,
                         cute::Stride<cute::Int<Rows>, cute::_1, cute::Int<Rows * Cols>>>{}));

// Global <-> shared copies of row tiles: 16 bytes per thread, a row's 16-byte chunks spread
// over consecutive threads.
template <class Element, int Threads, int Cols, class Op>
using RowTileCopy = decltype(cute::make_tiled_copy(
    cute::Copy_Atom<Op, Element>{},
    cute::Layout<cute::Shape<cute::Int<Threads / (kSwizzleWidth<Cols> / 8)>, cute::Int<kSwizzleWidth<Cols> / 8>>,
                 cute::Stride<cute::Int<kSwizzleWidth<Cols> / 8>, cute::_1>>{},
    cute::Layout<cute::Shape<cute::_1, cute::_8>>{}));
// cp.async with a zero-fill predicate (copy(tiled_copy.with(valid), ...)): rows past the end
// of a sequence become zeros in the same instruction, with no separate stores.
template <class Element, int Threads, int Cols>
using AsyncLoadCopy = RowTileCopy<Element, Threads, Cols, cute::SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<cute::uint128_t>>;
template <class Element, int Threads, int Cols>
using VectorCopy = RowTileCopy<Element, Threads, Cols, cute::AutoVectorizingCopyWithAssumedAlignment<128>>;

template <class Element>
using LdsmAtom = cute::Copy_Atom<cute::SM75_U32x4_LDSM_N, Element>;
template <class Element>
using LdsmTransposedAtom = cute::Copy_Atom<cute::SM75_U16x8_LDSM_T, Element>;
// Register -> shared stores of accumulator fragments (pairs of adjacent columns).
template <class Element>
using FragmentStoreAtom = cute::Copy_Atom<cute::AutoVectorizingCopyWithAssumedAlignment<32>, Element>;

// The main kernel (dK, dV, and dQ by atomics).
template <class Element_, int HeadDim, class Tiles_ = BackwardTiles<HeadDim>>
struct DkDvTraits : Tiles_ {
  using Tiles = Tiles_;
  using Element = Element_;
  static constexpr int kHeadDim = HeadDim;
  static constexpr int kBlockM = Tiles::kBlockM, kBlockN = Tiles::kBlockN;
  static constexpr int kThreads = Tiles::kWarps * 32;
  // Four-warp CTAs are sized to run two per SM (one's barriers hide under the other's math).
  static constexpr int kMinBlocksPerSm = Tiles::kWarps == 4 ? 2 : 1;
  static constexpr int kQStages = 2;

  using MmaSdP = WarpGridMma<Element, Tiles::kSdPWarpsM, Tiles::kWarps / Tiles::kSdPWarpsM>;
  using MmadKV = WarpGridMma<Element, Tiles::kdKVWarpsN, Tiles::kWarps / Tiles::kdKVWarpsN>;
  using MmadQ = WarpGridMma<Element, Tiles::kdQWarpsM, Tiles::kWarps / Tiles::kdQWarpsM>;

  using LayoutQ = SmemTileStaged<kBlockM, HeadDim, kQStages>;
  using LayoutQt = TransposedTileStaged<LayoutQ, kBlockM, HeadDim, kQStages>;
  using LayoutdO = SmemTile<kBlockM, HeadDim>;
  using LayoutdOt = TransposedTile<LayoutdO, kBlockM, HeadDim>;
  using LayoutKV = SmemTile<kBlockN, HeadDim>;
  using LayoutKVt = TransposedTile<LayoutKV, kBlockN, HeadDim>;
  using LayoutPdS = SmemTile<kBlockM, kBlockN>;
  using LayoutPdSt = TransposedTile<LayoutPdS, kBlockM, kBlockN>;

  struct SharedStorage {
    cute::array_aligned<Element, cute::cosize_v<LayoutQ>, 1024> q;
    cute::array_aligned<Element, cute::cosize_v<LayoutdO>, 1024> dout;
    cute::array_aligned<Element, cute::cosize_v<LayoutKV>, 1024> k;  // dK staging at the end
    cute::array_aligned<Element, cute::cosize_v<LayoutKV>, 1024> v;  // dV staging at the end
    cute::array_aligned<Element, cute::cosize_v<LayoutPdS>, 1024> p;
    cute::array_aligned<Element, cute::cosize_v<LayoutPdS>, 1024> ds;
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));

  using GmemLoad = AsyncLoadCopy<Element, kThreads, HeadDim>;
  using GmemStore = VectorCopy<Element, kThreads, HeadDim>;
};

// The deterministic dQ kernel.
template <class Element_, int HeadDim, class Tiles_ = BackwardTiles<HeadDim>>
struct DqTraits {
  using Tiles = Tiles_;
  using Element = Element_;
  static constexpr int kHeadDim = HeadDim;
  static constexpr int kBlockM = Tiles::kDqBlockM, kBlockN = Tiles::kDqBlockN;
  static constexpr int kThreads = Tiles::kDqWarps * 32;
  static constexpr int kKVStages = 2;

  // Warps along the query rows only: each warp owns whole rows of S, so dS (an accumulator)
  // is reused as the A operand of dQ = dS K without a trip through shared memory.
  using Mma = WarpGridMma<Element, Tiles::kDqWarps, 1>;

  using LayoutQ = SmemTile<kBlockM, HeadDim>;
  using LayoutKV = SmemTileStaged<kBlockN, HeadDim, kKVStages>;
  using LayoutKVt = TransposedTileStaged<LayoutKV, kBlockN, HeadDim, kKVStages>;

  struct SharedStorage {
    cute::array_aligned<Element, cute::cosize_v<LayoutQ>, 1024> q;
    cute::array_aligned<Element, cute::cosize_v<LayoutQ>, 1024> dout;
    cute::array_aligned<Element, cute::cosize_v<LayoutKV>, 1024> k;
    cute::array_aligned<Element, cute::cosize_v<LayoutKV>, 1024> v;
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));

  using GmemLoad = AsyncLoadCopy<Element, kThreads, HeadDim>;
};

}  // namespace flashattn::cuda::sm80
