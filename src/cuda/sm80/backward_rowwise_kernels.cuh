#pragma once
// The backward's memory-bound row passes, around the main kernel:
//   preprocess: D = rowsum(dO * O) in fp32 and LSE * log2(e), per query row, into the workspace,
//               clearing the dQ accumulator on its way;
//   dq_convert: dq = scale * dQ accumulator, in the output dtype (non-deterministic mode);
//   kv_reduce:  dk, dv = sum of the per-chunk fp32 partials in a fixed order (GQA split).
// A row of head_dim elements is handled by a group of lanes, 8 elements (16 bytes) each. Only
// the problem's columns are read and written (p.cols, common/head_columns.cuh: its head dim may
// be below HeadDim, the width; rows that are not 16-byte aligned move element by element). These
// passes are memory-bound: the test is one uniform branch per thread (ColumnMode::any), not a
// template parameter.
#include <cuda_runtime.h>

#include <cstdint>

#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>

#include "cuda/common/sequence_rows.cuh"
#include "cuda/sm80/backward_params.cuh"

namespace flashattn::cuda::sm80 {

template <int HeadDim>
struct RowwiseShape {
  static constexpr int kThreads = 128;
  static constexpr int kChunks = HeadDim / 8;  // 16-byte chunks of a 16-bit row
  static constexpr int kLanesPerRow = kChunks <= 4 ? 4 : kChunks <= 8 ? 8 : kChunks <= 16 ? 16 : 32;
  static constexpr int kRowsPerBlock = kThreads / kLanesPerRow;
  static_assert(HeadDim % 8 == 0 && kChunks <= 32, "head_dim must be a multiple of 8, at most 256");
};

template <class Element>
__device__ __forceinline__ void store_16_bytes(Element* dst, const cutlass::Array<Element, 8>& values, int col,
                                               const HeadColumns& cols) {
  store_piece<ColumnMode::any>(dst, *reinterpret_cast<const uint4*>(&values), col, cols);
}

// Elements col .. col + 7 of a row; those at columns >= cols.dim read as zeros.
template <class Element>
__device__ __forceinline__ cutlass::Array<Element, 8> load_16_bytes(const Element* src, int col,
                                                                   const HeadColumns& cols) {
  cutlass::Array<Element, 8> values;
  if (cols.vectors) {
    if (col < cols.dim) values = *reinterpret_cast<const cutlass::AlignedArray<Element, 8>*>(src);
    else values.fill(Element(0));
  } else {
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < 8; ++i) values[i] = col + i < cols.dim ? src[i] : Element(0);
  }
  return values;
}

// This CTA's contiguous share of `data` (count float4s) set to zero.
__device__ __forceinline__ void clear_share(float4* data, std::int64_t count) {
  const std::int64_t ctas = std::int64_t(gridDim.x) * gridDim.y * gridDim.z;
  const std::int64_t cta = blockIdx.x + std::int64_t(gridDim.x) * (blockIdx.y + std::int64_t(gridDim.y) * blockIdx.z);
  const std::int64_t share = (count + ctas - 1) / ctas;
  const std::int64_t end = min(count, (cta + 1) * share);
  for (std::int64_t i = cta * share + threadIdx.x; i < end; i += blockDim.x) data[i] = make_float4(0.f, 0.f, 0.f, 0.f);
}

template <class Element, int HeadDim>
__global__ void __launch_bounds__(RowwiseShape<HeadDim>::kThreads)
    backward_preprocess_kernel(const __grid_constant__ BackwardParams p) {
  using Shape = RowwiseShape<HeadDim>;
  if (p.zero_fill) clear_share(reinterpret_cast<float4*>(p.zero_fill), p.zero_fill_elements / 4);
  const int head = blockIdx.y, b = blockIdx.z;
  const SequenceRows seq = sequence_rows(b, p.seqlen_q, p.seqlen_k, p.cu_seqlens_q, p.cu_seqlens_k);
  if (int(blockIdx.x) * Shape::kRowsPerBlock >= seq.len_q) return;  // uniform per block
  const int row = blockIdx.x * Shape::kRowsPerBlock + threadIdx.x / Shape::kLanesPerRow;
  const int chunk = threadIdx.x % Shape::kLanesPerRow;
  const bool valid_row = row < seq.len_q;

  float dot = 0.0f;
  if (valid_row && chunk < Shape::kChunks) {
    auto at = [&](const detail::SeqTensor& t) {
      return static_cast<const Element*>(t.data) + b * t.batch_stride + (seq.row_q + row) * t.seq_stride +
             std::int64_t(head) * t.head_stride + chunk * 8;
    };
    const auto o = load_16_bytes(at(p.out), chunk * 8, p.cols);
    const auto d = load_16_bytes(at(p.dout), chunk * 8, p.cols);
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < 8; ++i) dot += float(o[i]) * float(d[i]);
  }
  CUTLASS_PRAGMA_UNROLL
  for (int offset = Shape::kLanesPerRow / 2; offset > 0; offset /= 2)
    dot += __shfl_xor_sync(0xffffffffu, dot, offset);

  if (valid_row && chunk == 0) {
    const std::int64_t index = std::int64_t(head) * p.dense_rows_q + seq.dense_q + row;
    p.delta[index] = dot;
    const float lse = p.lse.data[b * p.lse.batch_stride + head * p.lse.head_stride + seq.row_q + row];
    // A row that sees no key has LSE -inf; +inf makes its P = exp2(x - LSE) exactly 0.
    p.lse_log2[index] = lse == -INFINITY ? INFINITY : lse * 1.4426950408889634f;
  }
}

template <class Element, int HeadDim>
__global__ void __launch_bounds__(RowwiseShape<HeadDim>::kThreads)
    backward_dq_convert_kernel(const __grid_constant__ BackwardParams p) {
  using Shape = RowwiseShape<HeadDim>;
  const int head = blockIdx.y, b = blockIdx.z;
  const SequenceRows seq = sequence_rows(b, p.seqlen_q, p.seqlen_k, p.cu_seqlens_q, p.cu_seqlens_k);
  const int row = blockIdx.x * Shape::kRowsPerBlock + threadIdx.x / Shape::kLanesPerRow;
  const int chunk = threadIdx.x % Shape::kLanesPerRow;
  if (row >= seq.len_q || chunk >= Shape::kChunks) return;

  const float* acc = p.dq_accum + p.dq_accum_offset(p.dq_accum_row(b, seq.dense_q, row), head, chunk * 8, HeadDim);
  cutlass::Array<float, 8> values = *reinterpret_cast<const cutlass::AlignedArray<float, 8>*>(acc);
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < 8; ++i) values[i] *= p.scale;
  Element* dst = static_cast<Element*>(p.dq.data) + b * p.dq.batch_stride + (seq.row_q + row) * p.dq.seq_stride +
                 std::int64_t(head) * p.dq.head_stride + chunk * 8;
  store_16_bytes(dst, cutlass::NumericArrayConverter<Element, float, 8>{}(values), chunk * 8, p.cols);
}

template <class Element, int HeadDim>
__global__ void __launch_bounds__(RowwiseShape<HeadDim>::kThreads)
    backward_kv_reduce_kernel(const __grid_constant__ BackwardParams p) {
  using Shape = RowwiseShape<HeadDim>;
  const int kv_head = blockIdx.y, b = blockIdx.z;
  const SequenceRows seq = sequence_rows(b, p.seqlen_q, p.seqlen_k, p.cu_seqlens_q, p.cu_seqlens_k);
  const int row = blockIdx.x * Shape::kRowsPerBlock + threadIdx.x / Shape::kLanesPerRow;
  const int chunk = threadIdx.x % Shape::kLanesPerRow;
  if (row >= seq.len_k || chunk >= Shape::kChunks) return;

  const std::int64_t offset = ((seq.dense_k + row) * p.heads_kv + kv_head) * std::int64_t(HeadDim) + chunk * 8;
  const std::int64_t split_stride = p.dense_rows_k * p.heads_kv * std::int64_t(HeadDim);
  auto reduce_into = [&](const float* partial, const detail::SeqTensor& out) {
    cutlass::Array<float, 8> sum;
    sum.fill(0.0f);
    for (int s = 0; s < p.head_splits; ++s) {  // fixed order: the same bits on every run
      const auto part = *reinterpret_cast<const cutlass::AlignedArray<float, 8>*>(partial + s * split_stride + offset);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < 8; ++i) sum[i] += part[i];
    }
    Element* dst = static_cast<Element*>(out.data) + b * out.batch_stride + (seq.row_k + row) * out.seq_stride +
                   std::int64_t(kv_head) * out.head_stride + chunk * 8;
    store_16_bytes(dst, cutlass::NumericArrayConverter<Element, float, 8>{}(sum), chunk * 8, p.cols);
  };
  reduce_into(p.dk_partial, p.dk);
  reduce_into(p.dv_partial, p.dv);
}

}  // namespace flashattn::cuda::sm80
