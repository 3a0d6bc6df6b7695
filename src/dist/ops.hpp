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
  // Stream-ordered on CUDA (the library's workspace pool, which keeps freed memory for the next
  // call, and cudaFreeAsync, on `stream`).
  virtual void* allocate(std::size_t bytes, void* stream) const = 0;
  virtual void release(void* data, void* stream) const = 0;
  // `bytes` bytes from src to dst (raw, no conversion).
  virtual void copy_bytes(void* dst, const void* src, std::size_t bytes, void* stream) const = 0;
  // dst = src, converting the dtype (f32, f16, bf16); same shape.
  virtual void copy(const TensorView& dst, const TensorView& src, void* stream) const = 0;
  // dst = a + b (f32, f16 or bf16 each, summed in f32); same shape. dst may be a (accumulation).
  virtual void add(const TensorView& dst, const TensorView& a, const TensorView& b, void* stream) const = 0;
  // Every element of dst = value.
  virtual void fill(const TensorView& dst, float value, void* stream) const = 0;
  // Merges a partial result into an accumulator and writes the merged rows to dst_out (f32, f16
  // or bf16) and dst_lse (f32): the accumulator itself, or the final output. out_acc (f32, rows...,
  // head_dim), lse_acc (f32, rows...), out (f32/f16/bf16, like out_acc), lse (f32, like lse_acc).
  // Per row, L = logaddexp(lse_acc, lse); dst_out = out_acc * exp(lse_acc - L) + out * exp(lse - L);
  // dst_lse = L. Rows where both are -inf give (0, -inf).
  virtual void merge(const TensorView& dst_out, const TensorView& dst_lse, const TensorView& out_acc,
                     const TensorView& lse_acc, const TensorView& out, const TensorView& lse, void* stream) const = 0;
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
