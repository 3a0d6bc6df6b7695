#pragma once
// After the sm90 backward's main kernel: dq = softmax scale * the fp32 dQ accumulator, in the
// output dtype. The accumulator holds each block of query rows in the consumer warpgroups'
// fragment order (backward_traits.cuh), so thread t of this kernel reads what thread t of a
// consumer warpgroup staged and finds each value's (row, column) the way that thread did: from
// the dQ GEMM's partition of the block.
//
// The fragment order scatters a thread's values over eight rows, so writing them straight to dq
// stores 4 bytes per row and thread, half of every 32-byte sector unused (measured 2026-11-26 on
// an H200: 170 us at d = 128 for 16k tokens x 16 heads, 3x the bandwidth bound). The block is
// therefore converted into shared memory first and written out in row-major 16-byte vectors.
#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include "cuda/common/sequence_rows.cuh"
#include "cuda/sm90/backward_params.cuh"

namespace flashattn::cuda::sm90 {

struct DqConvertParams {
  const float* dq_accum;
  DqAccumulatorLayout layout;
  detail::SeqTensor dq;
  const std::int32_t* cu_seqlens_q;
  int seqlen_q;
  float scale;
  bool vector_stores;  // dq's base and strides allow 16-byte stores
};

// Grid: (query blocks, query heads, batch); 128 threads per column slice of a block (one per
// thread of the warpgroup that staged it).
template <class Traits>
__global__ void __launch_bounds__(Traits::kDqSlices * 128)
    backward_dq_convert_kernel(const __grid_constant__ DqConvertParams p) {
  using namespace cute;
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM, kCols = Traits::kDqCols, kHeadDim = Traits::kHeadDim;
  constexpr int kThreads = Traits::kDqSlices * 128;
  // Row pitch padded by 16 bytes: the fragment pairs of one store land in distinct banks.
  constexpr int kPitch = kHeadDim + 8;
  __shared__ alignas(16) Element tile[kBlockM * kPitch];

  const int m_block = blockIdx.x, head = blockIdx.y, b = blockIdx.z;
  const SequenceRows seq = sequence_rows(b, p.seqlen_q, 0, p.cu_seqlens_q, p.cu_seqlens_q);
  const int row0 = m_block * kBlockM;
  if (row0 >= seq.len_q) return;
  const int rows = min(kBlockM, seq.len_q - row0);
  const int slice = threadIdx.x / 128, thread = threadIdx.x % 128;  // column slice

  typename Traits::MmadQ mma;
  Tensor coords = mma.get_thread_slice(thread).partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kCols>>{}));
  const std::int64_t block = p.layout.first_block(b, seq.dense_q) + m_block;
  const float4* src = reinterpret_cast<const float4*>(p.dq_accum + p.layout.block_offset(head, block) +
                                                      slice * Traits::kDqElems);
  constexpr int kVectors = decltype(size(coords))::value / 4;
  CUTE_UNROLL
  for (int i = 0; i < kVectors; ++i) {
    const float4 v = src[i * 128 + thread];
    const float values[4] = {v.x, v.y, v.z, v.w};
    CUTE_UNROLL
    for (int j = 0; j < 4; j += 2) {  // fragment pairs are adjacent columns of one row
      const int row = get<0>(coords(4 * i + j)), col = slice * kCols + get<1>(coords(4 * i + j));
      cutlass::Array<Element, 2> pair;
      pair[0] = Element(values[j] * p.scale);
      pair[1] = Element(values[j + 1] * p.scale);
      *reinterpret_cast<cutlass::Array<Element, 2>*>(&tile[row * kPitch + col]) = pair;
    }
  }
  __syncthreads();

  Element* dst = static_cast<Element*>(p.dq.data) + b * p.dq.batch_stride + (seq.row_q + row0) * p.dq.seq_stride +
                 std::int64_t(head) * p.dq.head_stride;
  if (p.vector_stores) {
    constexpr int kChunks = kHeadDim / 8;  // 16-byte vectors per row
    for (int i = threadIdx.x; i < rows * kChunks; i += kThreads) {
      const int row = i / kChunks, chunk = i % kChunks;
      *reinterpret_cast<uint4*>(dst + row * p.dq.seq_stride + chunk * 8) =
          *reinterpret_cast<const uint4*>(&tile[row * kPitch + chunk * 8]);
    }
  } else {
    for (int i = threadIdx.x; i < rows * kHeadDim; i += kThreads) {
      const int row = i / kHeadDim, col = i % kHeadDim;
      dst[row * p.dq.seq_stride + col] = tile[row * kPitch + col];
    }
  }
}

}  // namespace flashattn::cuda::sm90
