#pragma once
// Small CTA- and thread-level tile operations for mma.sync kernels written with CuTe: GEMMs
// from shared memory (ldmatrix one k-block ahead of the tensor cores), row-predicated copies,
// fp32 atomics. Fragment views and conversions are in common/fragment.cuh.
#include <cute/tensor.hpp>
#include <cutlass/array.h>

#include "cuda/common/fragment.cuh"
#include "cuda/common/head_columns.cuh"

namespace flashattn::cuda::sm80 {

// acc += A * B, both operands in shared memory. rA, rB: the thread's register fragments
// (thr_mma.partition_fragment_A/B); sA, sB: the thread's ldmatrix sources
// (copy.get_thread_slice(t).partition_S); copy_a, copy_b: the tiled ldmatrix copies.
template <class Mma, class Acc, class RegA, class RegB, class SmemA, class SmemB, class CopyA,
          class CopyB>
__device__ __forceinline__ void gemm_smem(Mma& mma, Acc& acc, RegA& rA, RegB& rB, const SmemA& sA,
                                          const SmemB& sB, const CopyA& copy_a, const CopyB& copy_b) {
  using namespace cute;
  Tensor rA_view = copy_a.retile(rA);
  Tensor rB_view = copy_b.retile(rB);
  constexpr int kBlocks = decltype(size<2>(rA))::value;
  copy(copy_a, sA(_, _, _0{}), rA_view(_, _, _0{}));
  copy(copy_b, sB(_, _, _0{}), rB_view(_, _, _0{}));
  CUTE_UNROLL
  for (int kb = 0; kb < kBlocks; ++kb) {
    if (kb + 1 < kBlocks) {
      copy(copy_a, sA(_, _, kb + 1), rA_view(_, _, kb + 1));
      copy(copy_b, sB(_, _, kb + 1), rB_view(_, _, kb + 1));
    }
    gemm(mma, rA(_, _, kb), rB(_, _, kb), acc);
  }
}

// acc += A * B with A already in registers.
template <class Mma, class Acc, class RegA, class RegB, class SmemB, class CopyB>
__device__ __forceinline__ void gemm_reg_smem(Mma& mma, Acc& acc, const RegA& rA, RegB& rB,
                                              const SmemB& sB, const CopyB& copy_b) {
  using namespace cute;
  Tensor rB_view = copy_b.retile(rB);
  constexpr int kBlocks = decltype(size<2>(rA))::value;
  copy(copy_b, sB(_, _, _0{}), rB_view(_, _, _0{}));
  CUTE_UNROLL
  for (int kb = 0; kb < kBlocks; ++kb) {
    if (kb + 1 < kBlocks) copy(copy_b, sB(_, _, kb + 1), rB_view(_, _, kb + 1));
    gemm(mma, rA(_, _, kb), rB(_, _, kb), acc);
  }
}

// Copies a thread's share of a (rows x cols) tile, partitioned as (CPY, CPY_M, CPY_K), from
// global to shared memory with zero-filling cp.async (AsyncLoadCopy): rows at or beyond
// `valid_rows` (coords: the same partition of an identity tensor) read nothing and become
// zeros, so no garbage (or NaN) enters the GEMMs.
template <class TiledCopy, class Src, class Dst, class Coords>
__device__ __forceinline__ void load_rows_async(const TiledCopy& tiled_copy, const Src& src, Dst&& dst,
                                                const Coords& coords, int valid_rows) {
  using namespace cute;
  CUTE_UNROLL
  for (int m = 0; m < size<1>(src); ++m) {
    auto dst_row = dst(_, m, _);
    copy(tiled_copy.with(get<0>(coords(0, m, 0)) < valid_rows), src(_, m, _), dst_row);
  }
}

// Copies the rows below `valid_rows` of a thread's share of a tile (shared -> global).
template <class TiledCopy, class Src, class Dst, class Coords>
__device__ __forceinline__ void store_rows(const TiledCopy& tiled_copy, const Src& src, Dst&& dst,
                                           const Coords& coords, int valid_rows) {
  using namespace cute;
  CUTE_UNROLL
  for (int m = 0; m < size<1>(src); ++m)
    if (get<0>(coords(0, m, 0)) < valid_rows) copy(tiled_copy, src(_, m, _), dst(_, m, _));
}

// load_rows_async, and outside ColumnMode::full the columns too: pieces at columns >= cols.dim
// become zeros, rows that are not 16-byte aligned are read element by element
// (common/head_columns.cuh).
template <ColumnMode kColumns, class TiledCopy, class Src, class Dst, class Coords>
__device__ __forceinline__ void load_tile_async(const TiledCopy& tiled_copy, const Src& src, Dst&& dst,
                                                const Coords& coords, int valid_rows, const HeadColumns& cols) {
  using namespace cute;
  if constexpr (kColumns == ColumnMode::full) {
    load_rows_async(tiled_copy, src, dst, coords, valid_rows);
  } else {
    CUTE_UNROLL
    for (int m = 0; m < size<1>(src); ++m) {
      const bool row_valid = get<0>(coords(0, m, 0)) < valid_rows;
      CUTE_UNROLL
      for (int k = 0; k < size<2>(src); ++k)
        load_piece<kColumns>(&dst(0, m, k), &src(0, m, k), row_valid, get<1>(coords(0, m, k)), cols);
    }
  }
}

// store_rows, and outside ColumnMode::full only the columns < cols.dim (common/head_columns.cuh).
template <ColumnMode kColumns, class TiledCopy, class Src, class Dst, class Coords>
__device__ __forceinline__ void store_tile(const TiledCopy& tiled_copy, const Src& src, Dst&& dst,
                                           const Coords& coords, int valid_rows, const HeadColumns& cols) {
  using namespace cute;
  if constexpr (kColumns == ColumnMode::full) {
    store_rows(tiled_copy, src, dst, coords, valid_rows);
  } else {
    CUTE_UNROLL
    for (int m = 0; m < size<1>(src); ++m) {
      if (get<0>(coords(0, m, 0)) >= valid_rows) continue;
      CUTE_UNROLL
      for (int k = 0; k < size<2>(src); ++k)
        store_piece<kColumns>(&dst(0, m, k), *reinterpret_cast<const uint4*>(&src(0, m, k)), get<1>(coords(0, m, k)),
                          cols);
    }
  }
}

// dst[i] += acc[i] for an accumulator and its global partition (thr_mma.partition_C), by pairs
// of adjacent columns. Hopper has 8-byte float atomics; sm80 uses two 4-byte ones.
template <class Acc, class Dst>
__device__ __forceinline__ void atomic_add(const Acc& acc, const Dst& dst) {
  using namespace cute;
  Tensor acc_rc = rowcol_view(acc);
  Tensor dst_rc = rowcol_view(dst);
  CUTE_UNROLL
  for (int r = 0; r < size<0>(acc_rc); ++r) {
    CUTE_UNROLL
    for (int c = 0; c < size<1>(acc_rc); c += 2) {
      float* address = &dst_rc(r, c);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      atomicAdd(reinterpret_cast<float2*>(address), make_float2(acc_rc(r, c), acc_rc(r, c + 1)));
#else
      atomicAdd(address, acc_rc(r, c));
      atomicAdd(address + 1, acc_rc(r, c + 1));
#endif
    }
  }
}

// dst = acc for an accumulator in rows/cols view, by column pairs (one 2-element store each),
// rows below `valid_rows`.
template <class T>
struct alignas(2 * sizeof(T)) ElementPair {
  T first, second;
};

template <class Acc, class Dst, class Coords>
__device__ __forceinline__ void store_pairs(const Acc& acc, Dst&& dst, const Coords& coords,
                                            int valid_rows) {
  using namespace cute;
  using T = typename std::remove_reference_t<Dst>::value_type;
  CUTE_UNROLL
  for (int r = 0; r < size<0>(acc); ++r) {
    if (get<0>(coords(r, 0)) >= valid_rows) continue;
    CUTE_UNROLL
    for (int c = 0; c < size<1>(acc); c += 2)
      *reinterpret_cast<ElementPair<T>*>(&dst(r, c)) = ElementPair<T>{T(acc(r, c)), T(acc(r, c + 1))};
  }
}

// store_pairs, and outside ColumnMode::full only the columns < cols.dim (coords: (row, column) of
// each accumulator element).
template <ColumnMode kColumns, class Acc, class Dst, class Coords>
__device__ __forceinline__ void store_pairs(const Acc& acc, Dst&& dst, const Coords& coords, int valid_rows,
                                            const HeadColumns& cols) {
  using namespace cute;
  using T = typename std::remove_reference_t<Dst>::value_type;
  if constexpr (kColumns == ColumnMode::full) {
    store_pairs(acc, dst, coords, valid_rows);
  } else {
    CUTE_UNROLL
    for (int r = 0; r < size<0>(acc); ++r) {
      if (get<0>(coords(r, 0)) >= valid_rows) continue;
      CUTE_UNROLL
      for (int c = 0; c < size<1>(acc); c += 2)
        store_pair<kColumns>(&dst(r, c), T(acc(r, c)), T(acc(r, c + 1)), get<1>(coords(r, c)), cols);
    }
  }
}

}  // namespace flashattn::cuda::sm80
