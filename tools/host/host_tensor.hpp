#pragma once
// Host-side tensors with owned storage, for the command line, the tests and the benchmarks:
// any dtype, any strides (padding between rows is allowed and stays poisoned), random fill,
// poisoning, and element access by logical index.
#include <cstdint>
#include <random>
#include <vector>

#include "flashattn/tensor.hpp"

namespace flashattn::host {

class HostTensor {
 public:
  HostTensor() = default;
  // Contiguous storage for `shape`.
  HostTensor(DType dtype, std::vector<std::int64_t> shape);
  // Storage laid out with `stride` (in elements); `storage_elements` elements are allocated.
  HostTensor(DType dtype, std::vector<std::int64_t> shape, std::vector<std::int64_t> stride,
             std::int64_t storage_elements);

  DType dtype() const { return dtype_; }
  const std::vector<std::int64_t>& shape() const { return shape_; }
  const std::vector<std::int64_t>& stride() const { return stride_; }
  std::int64_t numel() const;
  std::size_t storage_bytes() const { return bytes_.size(); }
  void* data() { return bytes_.data(); }
  const void* data() const { return bytes_.data(); }

  // A view of this storage; `data` overrides the pointer (e.g. a device copy of the storage).
  TensorView view(DeviceKind device = DeviceKind::cpu, void* data = nullptr, int device_index = 0);

  // Logical element i (row-major over shape), as float.
  float get(std::int64_t i) const;
  void set(std::int64_t i, float value);

  void fill_normal(std::mt19937_64& rng, float stddev = 1.0f);
  // The same distribution from a counter-based generator: element i depends on (seed, i) alone,
  // so threads fill it in parallel and the values do not depend on their number. For
  // benchmark inputs of gigabytes (a long KV cache), where fill_normal takes minutes.
  void fill_normal_parallel(std::uint64_t seed, float stddev = 1.0f);
  // Every storage byte set to a NaN pattern (0xff), padding included.
  void poison();
  // All logical elements in row-major order as float.
  std::vector<float> to_floats() const;
  // A contiguous f32 copy (exact for f16/bf16).
  HostTensor to_f32() const;
  // Whether every byte outside the logical elements still holds the poison pattern.
  bool padding_untouched() const;

 private:
  std::int64_t offset_of(std::int64_t logical) const;

  DType dtype_ = DType::f32;
  std::vector<std::int64_t> shape_, stride_;
  std::vector<unsigned char> bytes_;
};

// ||a - b|| / ||b|| over elements where b is finite; NaN if a has a NaN where b is finite.
double relative_error(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace flashattn::host
