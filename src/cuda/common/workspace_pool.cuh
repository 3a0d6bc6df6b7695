#pragma once
// A library-private, stream-ordered memory pool per device for kernel workspaces.
//
// cudaMallocAsync on the device's default pool gives memory back to the system whenever a
// stream synchronizes (release threshold 0), so every call after a synchronization maps its
// workspace again: tens of microseconds, as long as a whole decoding step. This pool keeps
// freed memory (release threshold: unlimited) for the next call, and, being our own, changes
// nothing for the application's use of the default pool.
#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>

#include "cuda/common/check.cuh"

namespace flashattn::cuda {

inline cudaMemPool_t workspace_pool(int device) {
  constexpr int kMaxDevices = 64;
  static std::mutex mutex;
  static cudaMemPool_t pools[kMaxDevices] = {};
  if (device < 0 || device >= kMaxDevices) {
    cudaMemPool_t pool;
    FA_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
    return pool;
  }
  std::lock_guard<std::mutex> lock(mutex);
  if (pools[device] == nullptr) {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    cudaMemPool_t pool;
    FA_CUDA_CHECK(cudaMemPoolCreate(&pool, &props));
    std::uint64_t keep_all = UINT64_MAX;
    FA_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all));
    pools[device] = pool;
  }
  return pools[device];
}

// Stream-ordered allocation from the current device's workspace pool.
inline void* workspace_alloc_async(std::size_t bytes, cudaStream_t stream) {
  int device = 0;
  FA_CUDA_CHECK(cudaGetDevice(&device));
  void* ptr = nullptr;
  FA_CUDA_CHECK(cudaMallocFromPoolAsync(&ptr, bytes, workspace_pool(device), stream));
  return ptr;
}

}  // namespace flashattn::cuda
