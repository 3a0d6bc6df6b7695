#pragma once
// After the sm90 backward's main kernel: dq = softmax scale * the fp32 dQ accumulator, in the
// output dtype. The accumulator holds each block of query rows in the consumer warpgroups'
// fragment order (backward_traits.cuh), so thread t of this kernel reads what thread t of a
// consumer warpgroup staged and finds each value's (row, column) the way that thread did: from
// the dQ GEMM's partition of the block.
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
};

// Grid: (query blocks, query heads, batch); one thread per consumer thread of the main kernel.
template <class Traits>
__global__ void __launch_bounds__(Traits::kConsumerThreads)
    backward_dq_convert_kernel(const __grid_constant__ DqConvertParams p) {
  using namespace cute;
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM, kCols = Traits::kDqCols;
  const int m_block = blockIdx.x, head = blockIdx.y, b = blockIdx.z;
  const SequenceRows seq = sequence_rows(b, p.seqlen_q, 0, p.cu_seqlens_q, p.cu_seqlens_q);
  const int row0 = m_block * kBlockM;
  if (row0 >= seq.len_q) return;
  const int warp_group = threadIdx.x / 128, thread = threadIdx.x % 128;

  typename Traits::MmadQ mma;
  Tensor coords = mma.get_thread_slice(thread).partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kCols>>{}));
  const std::int64_t block = p.layout.first_block(b, seq.dense_q) + m_block;
  const float4* src = reinterpret_cast<const float4*>(p.dq_accum + p.layout.block_offset(head, block) +
                                                      warp_group * Traits::kDqElems);
  Element* dst = static_cast<Element*>(p.dq.data) + b * p.dq.batch_stride + (seq.row_q + row0) * p.dq.seq_stride +
                 std::int64_t(head) * p.dq.head_stride + warp_group * kCols;
  constexpr int kVectors = decltype(size(coords))::value / 4;
  CUTE_UNROLL
  for (int i = 0; i < kVectors; ++i) {
    const float4 v = src[i * 128 + thread];
    const float values[4] = {v.x, v.y, v.z, v.w};
    CUTE_UNROLL
    for (int j = 0; j < 4; j += 2) {  // fragment pairs are adjacent columns of one row
      const int row = get<0>(coords(4 * i + j)), col = get<1>(coords(4 * i + j));
      if (row0 + row >= seq.len_q) continue;
      cutlass::Array<Element, 2> pair;
      pair[0] = Element(values[j] * p.scale);
      pair[1] = Element(values[j + 1] * p.scale);
      *reinterpret_cast<cutlass::Array<Element, 2>*>(dst + row * p.dq.seq_stride + col) = pair;
    }
  }
}

}  // namespace flashattn::cuda::sm90
