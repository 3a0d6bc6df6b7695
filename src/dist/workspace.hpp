#pragma once
// Workspace for the context-parallel algorithms: contiguous tensors allocated through the
// device's DeviceOps, released (stream-ordered) when the Workspace goes away, and view helpers.
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "dist/ops.hpp"
#include "flashattn/distributed.hpp"

namespace flashattn::dist::detail {

class Workspace {
 public:
  Workspace(const DeviceOps& ops, DeviceKind device, int device_index, void* stream)
      : ops_(ops), device_(device), device_index_(device_index), stream_(stream) {}
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  ~Workspace() {
    for (void* p : blocks_) ops_.release(p, stream_);
  }

  // A contiguous tensor of `shape`.
  TensorView tensor(DType dtype, std::initializer_list<std::int64_t> shape) {
    std::int64_t n = 1;
    for (auto s : shape) n *= s;
    void* p = ops_.allocate(std::size_t(n > 0 ? n : 1) * element_size(dtype), stream_);
    blocks_.push_back(p);
    return TensorView::contiguous(p, dtype, shape, device_, device_index_);
  }
  // A tensor of `shape` whose last dimension's rows start 16-byte aligned (the LSE layout the
  // GPU kernels want): the innermost stride is padded to a multiple of 4 floats.
  TensorView padded_lse(std::initializer_list<std::int64_t> shape) {
    std::vector<std::int64_t> s(shape);
    const std::int64_t inner = (s.back() + 3) / 4 * 4;
    std::int64_t outer = 1;
    for (std::size_t i = 0; i + 1 < s.size(); ++i) outer *= s[i];
    void* p = ops_.allocate(std::size_t(outer * inner > 0 ? outer * inner : 1) * 4, stream_);
    blocks_.push_back(p);
    TensorView t;
    t.data = p;
    t.dtype = DType::f32;
    t.device = device_;
    t.device_index = device_index_;
    t.rank = int(s.size());
    std::int64_t stride = 1;
    for (int i = t.rank - 1; i >= 0; --i) {
      t.shape[i] = s[i];
      t.stride[i] = stride;
      stride *= (i == t.rank - 1) ? inner : s[i];
    }
    return t;
  }
  std::int32_t* offsets(int count) {
    void* p = ops_.allocate(std::size_t(count) * 4, stream_);
    blocks_.push_back(p);
    return static_cast<std::int32_t*>(p);
  }

 private:
  const DeviceOps& ops_;
  DeviceKind device_;
  int device_index_;
  void* stream_;
  std::vector<void*> blocks_;
};

// The bytes of a contiguous tensor.
inline Buffer bytes_of(const TensorView& t) {
  return Buffer{t.data, std::size_t(t.numel()) * element_size(t.dtype)};
}

// Whether `t` is row-major contiguous (dimensions of size 1 may have any stride).
inline bool contiguous(const TensorView& t) {
  std::int64_t expected = 1;
  for (int i = t.rank - 1; i >= 0; --i) {
    if (t.shape[i] != 1 && t.stride[i] != expected) return false;
    expected *= t.shape[i];
  }
  return true;
}

// `t` restricted to [begin, begin + length) along dimension `dim`.
inline TensorView slice(TensorView t, int dim, std::int64_t begin, std::int64_t length) {
  t.data = static_cast<char*>(t.data) + begin * t.stride[dim] * std::int64_t(element_size(t.dtype));
  t.shape[dim] = length;
  return t;
}

// `t` with dimensions `a` and `b` swapped (a view).
inline TensorView transpose(TensorView t, int a, int b) {
  std::swap(t.shape[a], t.shape[b]);
  std::swap(t.stride[a], t.stride[b]);
  return t;
}

}  // namespace flashattn::dist::detail
