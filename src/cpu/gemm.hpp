#pragma once
// The small fp32 matrix products of the attention tiles: C (+)= A * B with B and C row-major
// and A read through two strides, so that a transposed A (the score tile is stored keys x
// queries) costs nothing. A register-blocked micro-kernel computes an MR x (NV vectors) block
// of C: per step of the inner dimension it loads NV vectors of B, broadcasts MR values of A
// and issues MR * NV vector multiply-adds into accumulators that never leave registers.
#include <cstdint>

#include "cpu/simd.hpp"

namespace flashattn::cpu {

// Rows of C per micro-kernel. AVX-512 has 32 vector registers (16 accumulators + 2 B vectors),
// AVX2 and SSE have 16 (12 + 2). -DFLASHATTN_CPU_MR=n overrides it for tuning.
#if defined(FLASHATTN_CPU_MR)
inline constexpr int kMicroRows = FLASHATTN_CPU_MR;
#elif defined(__AVX512F__)
inline constexpr int kMicroRows = 8;
#else
inline constexpr int kMicroRows = 6;
#endif
inline constexpr int kMicroVecs = 2;  // vectors of C columns per micro-kernel
inline constexpr int kMicroCols = kMicroVecs * simd::kLanes;

// A(m, k) = data[m * row_stride + k * col_stride].
struct StridedMatrix {
  const float* data;
  std::int64_t row_stride;
  std::int64_t col_stride;
};

namespace detail_gemm {

template <int MR, int NV>
inline void micro_kernel(int depth, StridedMatrix a, const float* b, std::int64_t ldb, float* c,
                         std::int64_t ldc, bool accumulate) {
  using simd::Vec;
  Vec acc[MR][NV];
#pragma GCC unroll 16
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[m][v] = accumulate ? simd::load(c + m * ldc + v * simd::kLanes) : Vec{};

  const float* a_k = a.data;
  for (int k = 0; k < depth; ++k, a_k += a.col_stride, b += ldb) {
    Vec bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = simd::load(b + v * simd::kLanes);
#pragma GCC unroll 16
    for (int m = 0; m < MR; ++m) {
      const Vec am = simd::splat(a_k[m * a.row_stride]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[m][v] += am * bv[v];
    }
  }

#pragma GCC unroll 16
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) simd::store(c + m * ldc + v * simd::kLanes, acc[m][v]);
}

// The micro-kernel for the last `rows` (< MR) rows of C.
template <int NV, int MR = kMicroRows - 1>
inline void micro_kernel_tail(int rows, int depth, StridedMatrix a, const float* b, std::int64_t ldb,
                              float* c, std::int64_t ldc, bool accumulate) {
  if constexpr (MR > 0) {
    if (rows == MR) return micro_kernel<MR, NV>(depth, a, b, ldb, c, ldc, accumulate);
    micro_kernel_tail<NV, MR - 1>(rows, depth, a, b, ldb, c, ldc, accumulate);
  }
}

template <int NV>
inline void column_panel(int rows, int depth, StridedMatrix a, const float* b, std::int64_t ldb, float* c,
                         std::int64_t ldc, bool accumulate) {
  int m = 0;
  for (; m + kMicroRows <= rows; m += kMicroRows) {
    const StridedMatrix a_m{a.data + m * a.row_stride, a.row_stride, a.col_stride};
    micro_kernel<kMicroRows, NV>(depth, a_m, b, ldb, c + m * ldc, ldc, accumulate);
  }
  if (m < rows) {
    const StridedMatrix a_m{a.data + m * a.row_stride, a.row_stride, a.col_stride};
    micro_kernel_tail<NV>(rows - m, depth, a_m, b, ldb, c + m * ldc, ldc, accumulate);
  }
}

}  // namespace detail_gemm

// C[rows][cols] = A[rows][depth] * B[depth][cols] (or += with accumulate). cols must be a
// multiple of simd::kLanes; B and C are row-major with leading dimensions ldb and ldc.
// Column panels outermost, so that a depth x kMicroCols panel of B stays in L1 while the
// micro-kernels sweep the rows of A.
inline void gemm(int rows, int cols, int depth, StridedMatrix a, const float* b, std::int64_t ldb, float* c,
                 std::int64_t ldc, bool accumulate) {
  int n = 0;
  for (; n + kMicroCols <= cols; n += kMicroCols)
    detail_gemm::column_panel<kMicroVecs>(rows, depth, a, b + n, ldb, c + n, ldc, accumulate);
  for (; n < cols; n += simd::kLanes)
    detail_gemm::column_panel<1>(rows, depth, a, b + n, ldb, c + n, ldc, accumulate);
}

}  // namespace flashattn::cpu
