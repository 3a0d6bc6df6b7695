#pragma once
// The few element-wise operations the context-parallel algorithms need besides attention
// itself, on the CPU (cpu_ops.cpp) and on CUDA (cuda_ops.cu): workspace, copies with dtype
// conversion, float32 accumulation, and the LSE merge of partial outputs. Views of rank <= 4,
// any strides; shapes are checked by the callers (ring.cpp, all_to_all.cpp).
#include <cstddef>
#include <cstdint>

#include "flashattn/tensor.hpp"

namespace flashattn::dist::detail {

class DeviceOps {
 public:
  virtual ~DeviceOps() = default;
  // Stream-ordered on CUDA (cudaMallocAsync / cudaFreeAsync on `stream`).
  virtual void* allocate(std::size_t bytes, void* stream) const = 0;
  virtual void release(void* data, void* stream) const = 0;
  // dst = src, converting the dtype (f32, f16, bf16); same shape.
  virtual void copy(const TensorView& dst, const TensorView& src, void* stream) const = 0;
  // dst (f32) += src (f32, f16 or bf16); same shape.
  virtual void add(const TensorView& dst, const TensorView& src, void* stream) const = 0;
  // Every element of dst (f32) = value.
  virtual void fill(const TensorView& dst, float value, void* stream) const = 0;
  // Merges a partial result into an accumulator: out_acc (f32, rows..., head_dim), lse_acc (f32,
  // rows...), out (f32/f16/bf16, like out_acc), lse (f32, like lse_acc). Per row,
  // L = logaddexp(lse_acc, lse); out_acc = out_acc * exp(lse_acc - L) + out * exp(lse - L);
  // lse_acc = L. Rows where both are -inf stay (0, -inf).
  virtual void merge(const TensorView& out_acc, const TensorView& lse_acc, const TensorView& out,
                     const TensorView& lse, void* stream) const = 0;
  // dst[i] = src[i] / divisor (int32, `count` entries): the offsets of one zigzag chunk.
  virtual void divide_offsets(std::int32_t* dst, const std::int32_t* src, int count, int divisor,
                              void* stream) const = 0;
};

const DeviceOps& cpu_ops();
const DeviceOps& cuda_ops();  // throws ErrorKind::unsupported in a build without CUDA

inline const DeviceOps& ops_for(DeviceKind device) {
  return device == DeviceKind::cuda ? cuda_ops() : cpu_ops();
}

}  // namespace flashattn::dist::detail
