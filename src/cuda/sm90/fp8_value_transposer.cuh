#pragma once
// V^T for the FP8 forward written in the kernel (Traits::kTransposeValue): V arrives by TMA as
// rows (keys x head dim, laid out as K's stages) in stages of its own, and the producer
// warpgroup's other three warps (run_value_transposer) write each block's V^T into the stage the
// P.V GEMM reads, as FlashAttention-3 does: ldmatrix .trans over pairs of bytes, byte permutes,
// stmatrix. V^T's keys are in transposed_value_key's order, as the pre-pass writes them
// (fp8_value_transpose.cuh).
// Each query tile transposes every V block it reads, so the cost grows with the query rows that
// read a KV head's V; the pre-pass moves V once a call. forward_heuristics.hpp
// (fp8_transposes_value_in_kernel) picks per call (docs/kernels/fp8-forward.md).
#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "cuda/sm90/forward_params.cuh"
#include "cuda/sm90/forward_tile.cuh"
#include "cuda/sm90/fp8_value_transpose.cuh"

namespace flashattn::cuda::sm90 {

// A warp's unit of the transpose: 16 keys x 32 head dims (512 bytes).
//  - In: ldmatrix.x4.trans over pairs of bytes (16-bit elements). Matrix m covers keys 8 (m & 1) ..
//    + 7 and dims 16 (m >> 1) .. + 15; lane l receives of each, for the pair of dims 2c, 2c + 1
//    (c = l / 4), keys 2u and 2u + 1 (u = l % 4): bytes (2u, 2c), (2u, 2c + 1), (2u + 1, 2c),
//    (2u + 1, 2c + 1).
//  - Permutes: of matrices 0 and 1 (keys 0-7 and 8-15 of the unit), dim 2c's bytes of keys 2u,
//    2u + 1, 2u + 8, 2u + 9 (0x6420), which are slots 4u .. 4u + 3 (transposed_value_key); dim
//    2c + 1's (0x7531).
//  - Out: stmatrix.x4 writes lane l's word of each of its matrices to row c, word u. A matrix's
//    rows are 16-byte pieces (the unit's 16 keys) of 8 rows of V^T: matrix 0 takes dims 2c for
//    c < 4 and 2c + 1 for c >= 4, matrix 1 the others (2 and 3 the same of the next 16 dims), so
//    that its rows' dims differ mod 8 and, under the stage's swizzle, fall in 8 different groups of
//    banks (dims 0, 2, .., 14 would fall in 4, a 2-way conflict).
constexpr int kTransposeUnitKeys = 16, kTransposeUnitDims = 32;

// This lane's row of the ldmatrix (key and dim from the unit's first): matrix l / 8, row l % 8.
CUTE_HOST_DEVICE constexpr int transpose_in_key(int lane) { return (lane & 7) + 8 * ((lane >> 3) & 1); }
CUTE_HOST_DEVICE constexpr int transpose_in_dim(int lane) { return 16 * (lane >> 4); }
// This lane's row of the stmatrix: the dim of matrix l / 8's row l % 8.
CUTE_HOST_DEVICE constexpr int transpose_out_dim(int lane) {
  const int m = lane >> 3, row = lane & 7;
  return 16 * (m >> 1) + 2 * row + ((m & 1) ^ (row >> 2));
}

// Addresses without recomputing the swizzle per unit: in both stages' layouts (K-major atoms of
// 8 rows, 32, 64 or 128-byte swizzles), a lane's part of a unit's offset (its row and 16 bytes
// within the unit), the unit's keys' and its dims' parts are bitwise disjoint except where the
// swizzle's XOR lands, so that the offset is their XOR (for 1-byte elements, offsets are bytes),
// plus the stage's. Checked at compile time (transposer_addresses_hold) on a sample of units, and
// by the FP8 case table on every kernel.
template <class Layout>
CUTE_HOST_DEVICE constexpr bool offsets_are_xor_of_parts(Layout layout, int rows, int cols, int row_step, int col_step,
                                                         int row_part, int col_part) {
  // The first, second and last units along each mode (every unit is more than the compiler's
  // constant evaluation allows); the parts' bits repeat beyond them.
  const int row_units[3] = {0, row_step % rows, rows - row_step}, col_units[3] = {0, col_step % cols, cols - col_step};
  for (int r0 : row_units)
    for (int c0 : col_units)
      for (int r = 0; r < row_part; ++r)
        for (int c = 0; c < col_part; c += 16)
          if (int(layout(r0 + r, c0 + c, 1)) !=
              int(layout(0, 0, 1)) + (int(layout(r, c, 0)) ^ int(layout(r0, 0, 0)) ^ int(layout(0, c0, 0))))
            return false;
  return true;
}

// Whether the transposer's addresses hold for the stages of `Traits` (both layouts checked as
// above). They do not for e4m3 at head dim 96 on 128-row tiles (192-key blocks of 32-byte swizzle
// atoms: a unit's key and dim parts share bits), which takes the pre-pass (forward_launch.cuh).
template <class Traits>
constexpr bool transposer_addresses_hold() {
  constexpr int kBlockN = Traits::kBlockN, kHeadDim = Traits::kHeadDim;
  if constexpr (kBlockN % kTransposeUnitKeys != 0 || kHeadDim % kTransposeUnitDims != 0) {
    return false;
  } else {
    return offsets_are_xor_of_parts(typename Traits::SmemLayoutV{}, kBlockN, kHeadDim, kTransposeUnitKeys,
                                    kTransposeUnitDims, kTransposeUnitKeys, kTransposeUnitDims) &&
           offsets_are_xor_of_parts(typename Traits::SmemLayoutVt{}, kHeadDim, kBlockN, kTransposeUnitDims,
                                    kTransposeUnitKeys, kTransposeUnitDims, 1);
  }
}

// CuTe's SM75_U16x8_LDSM_T and SM90_U32x4_STSM_N, taking a 32-bit shared-memory address: theirs
// take a reference, and the first build, through them, computed every unit's address as a 64-bit
// generic pointer (SASS, 2026-11-29).
CUTE_DEVICE void ldmatrix_x4_trans(uint32_t address, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.x4.trans.m8n8.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(address));
}
CUTE_DEVICE void stmatrix_x4(uint32_t address, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.x4.m8n8.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(address), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3));
}

// The producer warpgroup's warps 1-3 (Traits::kValueWarpThreads threads; `thread` counts from 0
// among them), in the FP8 forward: each block of V's rows that the producer warp loads
// (pipeline_rows, the blocks of each published work item, last to first) becomes V^T in the stage
// of pipeline_v the consumers read next. Every thread arrives on that stage's full barrier once its
// stores are made visible to wgmma's reads (the async proxy), and on the rows' empty barrier.
template <class Traits>
CUTE_DEVICE void run_value_transposer(ForwardParams<Traits> const& p, typename Traits::SharedStorage& smem,
                                      typename Traits::PipelineV& pipeline_rows, typename Traits::PipelineV& pipeline_v,
                                      typename Traits::PipelineTile& pipeline_tile, int thread) {
  using namespace cute;
  constexpr int kBlockN = Traits::kBlockN, kHeadDim = Traits::kHeadDim;
  constexpr int kKeyUnits = kBlockN / kTransposeUnitKeys;
  constexpr int kWarps = Traits::kValueWarpThreads / 32;
  constexpr int kDimUnits = kHeadDim / kTransposeUnitDims;
  // Units loaded before their stores: two (one: 3.5-4% slower at d = 256; four: level with two;
  // H200, 2026-11-29). In the SASS at d = 256 ptxas still gives both loads one destination quad in
  // the warps' 24 registers, so each load's latency is waited out in turn (docs/kernels/fp8-forward.md).
  constexpr int kInFlight = kDimUnits % 2 == 0 ? 2 : 1;
  using RowsLayout = typename Traits::SmemLayoutV;    // (key, dim, stage)
  using ValueTLayout = typename Traits::SmemLayoutVt;  // (dim, key, stage)
  static_assert(transposer_addresses_hold<Traits>(), "whole units, whose offsets are the XOR of their parts");
  const uint32_t rows_base = cast_smem_ptr_to_uint(smem.v_rows.data());
  const uint32_t vt_base = cast_smem_ptr_to_uint(smem.v.data());
  const int warp = thread / 32, lane = thread % 32;
  const uint32_t in_offset = RowsLayout{}(transpose_in_key(lane), transpose_in_dim(lane), 0);
  const uint32_t out_offset = ValueTLayout{}(transpose_out_dim(lane), 0, 0);
  // Matrix 0's word (and 2's) is dim 2c's for c < 4, dim 2c + 1's for c >= 4 (lanes 16-31).
  const uint32_t first = lane < 16 ? 0x6420u : 0x7531u, second = lane < 16 ? 0x7531u : 0x6420u;

  auto state_rows = typename Traits::PipelineV::PipelineState{};
  auto state_v = cutlass::make_producer_start_state<typename Traits::PipelineV>();
  for_each_published_item(pipeline_tile, smem, p.tail.num_items(), [&](TileWork const& w) {
    for (int block = w.key_blocks.end - 1; block >= w.key_blocks.begin; --block) {
      pipeline_rows.consumer_wait(state_rows);
      pipeline_v.producer_acquire(state_v);  // no thread leads: only the wait for a free stage
      const uint32_t rows_stage = rows_base + uint32_t(RowsLayout{}(0, 0, state_rows.index()));
      const uint32_t vt_stage = vt_base + uint32_t(ValueTLayout{}(0, 0, state_v.index()));
      // A warp takes every kWarps-th group of 16 keys and, for each, the whole head dim. The
      // groups' loop is not unrolled, so that only one group's addresses are live (the warps hold
      // 24-40 registers).
#pragma unroll 1
      for (int group = warp; group < kKeyUnits; group += kWarps) {
        const int key0 = kTransposeUnitKeys * group;
        const uint32_t in_group = in_offset ^ uint32_t(RowsLayout{}(key0, 0, 0));
        const uint32_t out_group = out_offset ^ uint32_t(ValueTLayout{}(0, key0, 0));
        CUTE_UNROLL
        for (int unit = 0; unit < kDimUnits; unit += kInFlight) {
          uint32_t r[kInFlight][4];
          CUTE_UNROLL
          for (int i = 0; i < kInFlight; ++i) {
            const int dim0 = kTransposeUnitDims * (unit + i);
            ldmatrix_x4_trans(rows_stage + (in_group ^ uint32_t(RowsLayout{}(0, dim0, 0))), r[i][0], r[i][1], r[i][2],
                              r[i][3]);
          }
          CUTE_UNROLL
          for (int i = 0; i < kInFlight; ++i) {
            const int dim0 = kTransposeUnitDims * (unit + i);
            stmatrix_x4(vt_stage + (out_group ^ uint32_t(ValueTLayout{}(dim0, 0, 0))), __byte_perm(r[i][0], r[i][1], first),
                        __byte_perm(r[i][0], r[i][1], second), __byte_perm(r[i][2], r[i][3], first),
                        __byte_perm(r[i][2], r[i][3], second));
          }
        }
      }
      cutlass::arch::fence_view_async_shared();
      smem.pipeline_v.full_barrier_[state_v.index()].arrive();
      pipeline_rows.consumer_release(state_rows);
      ++state_rows;
      ++state_v;
    }
  });
}

}  // namespace flashattn::cuda::sm90
