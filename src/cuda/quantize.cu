// quantize_e4m3 on CUDA (flashattn/fp8.hpp): one warp per row (b, s, h) of x, each lane holding
// ceil(head_dim / 32) consecutive elements. Two passes: the maxima of each descale slot (a CTA
// per (b, h) and 64 rows, which lie in one block of kFp8ScaleBlockRows, one atomicMax per CTA),
// then the values, which every CTA recomputes and divides by its slot's factor. The operations
// and their order are the CPU backend's (cpu/quantize.cpp), with IEEE-rounded intrinsics so that
// fast math changes nothing, and the same rounding to e4m3 (common/numeric.hpp, no sm_89
// instruction: every GPU): both give the same bits.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include <cutlass/numeric_types.h>

#include "common/numeric.hpp"
#include "cuda/backend.hpp"
#include "cuda/common/check.cuh"
#include "cuda/common/stream_workspace.cuh"
#include "flashattn/error.hpp"

namespace flashattn::cuda {
namespace {

constexpr int kRowsPerCta = 64;  // 8 warps x 8 rows
constexpr int kThreads = 256;

__device__ float to_float(const void* base, std::int64_t i, DType dtype) {
  switch (dtype) {
    case DType::f16: return float(static_cast<const cutlass::half_t*>(base)[i]);
    case DType::bf16: return float(static_cast<const cutlass::bfloat16_t*>(base)[i]);
    default: return static_cast<const float*>(base)[i];
  }
}

// This lane's kPerLane elements of row (b, s, h) (columns lane * kPerLane + j, zero past the head
// dim), transformed when the problem has signs (then the head dim is a power of two, so the
// pairs at distance half < kPerLane are within a lane and the others a lane ^ (half / kPerLane)
// apart, at the same j).
template <int kPerLane>
__device__ void load_row(const detail::QuantizeProblem& p, int b, int s, int h, int lane, float (&v)[kPerLane]) {
  const std::int64_t base = b * p.x_batch_stride + s * p.x_seq_stride + h * p.x_head_stride;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int d = lane * kPerLane + j;
    v[j] = d < p.head_dim ? to_float(p.x, base + d, p.dtype) : 0.0f;
  }
  if (p.signs == nullptr) return;  // uniform
#pragma unroll
  for (int j = 0; j < kPerLane; ++j)
    if (lane * kPerLane + j < p.head_dim) v[j] = __fmul_rn(v[j], p.signs[lane * kPerLane + j]);
#pragma unroll
  for (int half = 1; half < kPerLane; half *= 2)
#pragma unroll
    for (int j = 0; j < kPerLane; ++j)
      if ((j & half) == 0) {
        const float lower = v[j], upper = v[j + half];
        v[j] = __fadd_rn(lower, upper);
        v[j + half] = __fsub_rn(lower, upper);
      }
  for (int half = kPerLane; half < p.head_dim; half *= 2) {
    const int mask = half / kPerLane;
    const bool upper_lane = lane & mask;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const float other = __shfl_xor_sync(0xffffffffu, v[j], mask);
      v[j] = upper_lane ? __fsub_rn(other, v[j]) : __fadd_rn(v[j], other);
    }
  }
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) v[j] = __fmul_rn(v[j], p.transform_scale);
}

// grid (row chunks, batch * heads): amax over the chunk's rows of (b, h) into amax[slot] (as the
// bits of a non-negative float, which order like the floats).
template <int kPerLane>
__global__ void __launch_bounds__(kThreads) amax_kernel(const detail::QuantizeProblem p, unsigned* amax) {
  const int b = blockIdx.y / p.heads, h = blockIdx.y % p.heads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float m = 0.0f;
  for (int s = blockIdx.x * kRowsPerCta + warp; s < min(p.seqlen, (blockIdx.x + 1) * kRowsPerCta); s += kThreads / 32) {
    float v[kPerLane];
    load_row<kPerLane>(p, b, s, h, lane, v);
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) m = fmaxf(m, fabsf(v[j]));
  }
  for (int offset = 16; offset > 0; offset /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
  __shared__ float warp_max[kThreads / 32];
  if (lane == 0) warp_max[warp] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) m = fmaxf(m, warp_max[w]);
    atomicMax(amax + p.slot(b, blockIdx.x * kRowsPerCta, h), __float_as_uint(m));
  }
}

__device__ float slot_descale(const unsigned* amax, int slot) {
  return fmaxf(__fdiv_rn(__uint_as_float(amax[slot]), detail::kE4m3Max), detail::kMinDescale);
}

// Same grid: the values, and (first chunk of each slot's rows of (b, h)) the slot's factor.
template <int kPerLane>
__global__ void __launch_bounds__(kThreads) quantize_kernel(const detail::QuantizeProblem p, const unsigned* amax) {
  const int b = blockIdx.y / p.heads, h = blockIdx.y % p.heads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int slot = p.slot(b, blockIdx.x * kRowsPerCta, h);
  const float descale = slot_descale(amax, slot);
  const bool first_chunk_of_slot = p.blocks > 1 ? (blockIdx.x * kRowsPerCta) % kFp8ScaleBlockRows == 0 : blockIdx.x == 0;
  if (first_chunk_of_slot && threadIdx.x == 0)
    p.descale[p.descale_offset(slot)] = descale;  // the same value from every h of the slot
  for (int s = blockIdx.x * kRowsPerCta + warp; s < min(p.seqlen, (blockIdx.x + 1) * kRowsPerCta); s += kThreads / 32) {
    float v[kPerLane];
    load_row<kPerLane>(p, b, s, h, lane, v);
    std::uint8_t* out = p.out + b * p.out_batch_stride + s * p.out_seq_stride + h * p.out_head_stride;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int d = lane * kPerLane + j;
      if (d < p.head_dim) {
        out[d] = detail::float_to_e4m3(__fdiv_rn(v[j], descale));  // any GPU: no sm_89 cvt
      }
    }
  }
}

template <int kPerLane>
void launch(const detail::QuantizeProblem& p, unsigned* amax, cudaStream_t stream) {
  const dim3 grid(unsigned(p.seqlen > 0 ? (p.seqlen + kRowsPerCta - 1) / kRowsPerCta : 1), unsigned(p.batch * p.heads));
  if (p.seqlen > 0) {
    amax_kernel<kPerLane><<<grid, kThreads, 0, stream>>>(p, amax);
    FA_CUDA_CHECK(cudaGetLastError());
  }
  // With no rows, this writes every factor as the minimum (as the CPU backend does).
  quantize_kernel<kPerLane><<<grid, kThreads, 0, stream>>>(p, amax);
  FA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void quantize_e4m3(const detail::QuantizeProblem& p) {
  static_assert(kFp8ScaleBlockRows % kRowsPerCta == 0, "a CTA's rows lie in one block");
  if (p.batch == 0 || p.heads == 0 || p.slots() == 0) return;
  int previous = 0;
  FA_CUDA_CHECK(cudaGetDevice(&previous));
  if (previous != p.device_index) FA_CUDA_CHECK(cudaSetDevice(p.device_index));
  cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  if (std::int64_t(p.batch) * p.heads > 65535)
    throw Error(ErrorKind::unsupported, "x.shape", "batch * heads at most 65535 on the CUDA backend",
                std::to_string(std::int64_t(p.batch) * p.heads));
  WorkspacePlan plan;
  const std::size_t amax_offset = plan.add<unsigned>(std::size_t(p.slots()));
  StreamWorkspace workspace(plan.bytes(), stream);
  unsigned* amax = workspace.at<unsigned>(amax_offset);
  FA_CUDA_CHECK(cudaMemsetAsync(amax, 0, std::size_t(p.slots()) * sizeof(unsigned), stream));
  switch ((p.head_dim + 31) / 32) {  // elements per lane; validation keeps head dims <= 256
    case 1: launch<1>(p, amax, stream); break;
    case 2: launch<2>(p, amax, stream); break;
    case 3: launch<3>(p, amax, stream); break;
    case 4: launch<4>(p, amax, stream); break;
    case 5: launch<5>(p, amax, stream); break;
    case 6: launch<6>(p, amax, stream); break;
    case 7: launch<7>(p, amax, stream); break;
    default: launch<8>(p, amax, stream); break;
  }
  if (previous != p.device_index) FA_CUDA_CHECK(cudaSetDevice(previous));
}

}  // namespace flashattn::cuda
