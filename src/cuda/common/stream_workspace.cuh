#pragma once
// Scratch device memory in stream order: allocated from the library's workspace pool
// (workspace_pool.cuh) on construction, cudaFreeAsync on destruction, both on the problem's
// stream, so kernels enqueued in between may use it and nothing synchronizes. Several buffers
// share one allocation, each 256-byte aligned.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/common/check.cuh"
#include "cuda/common/workspace_pool.cuh"

namespace flashattn::cuda {

// Plans the buffers: add() returns a buffer's offset; bytes() is the total.
class WorkspacePlan {
 public:
  template <class T>
  std::size_t add(std::size_t count) {
    const std::size_t offset = bytes_;
    bytes_ += (count * sizeof(T) + kAlign - 1) / kAlign * kAlign;
    return offset;
  }
  std::size_t bytes() const { return bytes_; }

 private:
  static constexpr std::size_t kAlign = 256;
  std::size_t bytes_ = 0;
};

class StreamWorkspace {
 public:
  StreamWorkspace(std::size_t bytes, cudaStream_t stream) : stream_(stream) {
    // From the library's pool, which keeps freed memory for the next call (workspace_pool.cuh).
    if (bytes > 0) base_ = workspace_alloc_async(bytes, stream);
  }
  ~StreamWorkspace() {
    if (base_ != nullptr) cudaFreeAsync(base_, stream_);
  }
  StreamWorkspace(const StreamWorkspace&) = delete;
  StreamWorkspace& operator=(const StreamWorkspace&) = delete;

  template <class T>
  T* at(std::size_t offset) const {
    return reinterpret_cast<T*>(static_cast<char*>(base_) + offset);
  }

 private:
  void* base_ = nullptr;
  cudaStream_t stream_;
};

}  // namespace flashattn::cuda
