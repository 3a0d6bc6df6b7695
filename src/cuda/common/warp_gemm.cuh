#pragma once
// Warp-level GEMM steps for mma.sync kernels: each thread's slice of acc += A * B over the K
// mode, with operands moved from shared memory into registers by ldmatrix one k-slice ahead of
// the mma that uses them (so the loads of slice k+1 overlap the mmas of slice k).
//
// Arguments follow CuTe's partitioning: rX are the thread's register fragments
// (MMA, MMA_M|N, MMA_K) from partition_fragment_A/B, sX the shared-memory source partitioned by
// the matching smem tiled copy (make_tiled_copy_A/B), copy_X that tiled copy and its thread slice.
#include <cute/tensor.hpp>

namespace flashattn::cuda {

// acc += A * B, both operands in shared memory.
template <class Acc, class RA, class RB, class SA, class SB, class TiledMma, class CopyA,
          class ThrCopyA, class CopyB, class ThrCopyB>
CUTE_DEVICE void gemm_smem_smem(Acc& acc, RA& rA, RB& rB, SA const& sA, SB const& sB,
                                TiledMma const& mma, CopyA const& copy_a, ThrCopyA const& thr_a,
                                CopyB const& copy_b, ThrCopyB const& thr_b) {
  using namespace cute;
  Tensor rA_view = thr_a.retile_D(rA);
  Tensor rB_view = thr_b.retile_D(rB);
  constexpr int kSlices = decltype(size<2>(rA))::value;
  copy(copy_a, sA(_, _, 0), rA_view(_, _, 0));
  copy(copy_b, sB(_, _, 0), rB_view(_, _, 0));
#pragma unroll
  for (int k = 0; k < kSlices; ++k) {
    if (k + 1 < kSlices) {
      copy(copy_a, sA(_, _, k + 1), rA_view(_, _, k + 1));
      copy(copy_b, sB(_, _, k + 1), rB_view(_, _, k + 1));
    }
    gemm(mma, rA(_, _, k), rB(_, _, k), acc);
  }
}

// acc += A * B, A already in registers (e.g. probabilities P), B in shared memory.
template <class Acc, class RA, class RB, class SB, class TiledMma, class CopyB, class ThrCopyB>
CUTE_DEVICE void gemm_reg_smem(Acc& acc, RA const& rA, RB& rB, SB const& sB, TiledMma const& mma,
                               CopyB const& copy_b, ThrCopyB const& thr_b) {
  using namespace cute;
  Tensor rB_view = thr_b.retile_D(rB);
  constexpr int kSlices = decltype(size<2>(rA))::value;
  copy(copy_b, sB(_, _, 0), rB_view(_, _, 0));
#pragma unroll
  for (int k = 0; k < kSlices; ++k) {
    if (k + 1 < kSlices) copy(copy_b, sB(_, _, k + 1), rB_view(_, _, k + 1));
    gemm(mma, rA(_, _, k), rB(_, _, k), acc);
  }
}

}  // namespace flashattn::cuda
