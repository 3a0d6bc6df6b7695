#pragma once
// Programmatic dependent launch (sm_90 and later): a kernel launched with it may be scheduled
// while the kernel before it in the stream is still running, so the launch latency between two
// short kernels (the KV-cache append and the attention; the split-KV attention and its combine)
// overlaps the first one's tail instead of adding to it.
//
// A kernel launched this way must call wait_for_previous_grid() before it reads or writes any
// global memory: that waits until the previous grid has completed and its writes are visible. A
// kernel may call allow_next_grid() to let the next one be scheduled before it exits (without it,
// at its exit). Both are no-ops when the kernel was launched the ordinary way, and compile to
// nothing before sm_90, which is why launch_programmatic() takes a kernel's own word for it
// (compiled_with_grid_wait) before using the attribute.
#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "cuda/common/check.cuh"

namespace flashattn::cuda {

__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_next_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" :::);
#endif
}

// Whether the code of `kernel` that runs on the current device was compiled for sm_90 or later,
// so that its wait_for_previous_grid() is there (code JIT-compiled from older PTX has none).
template <class Kernel>
bool compiled_with_grid_wait(Kernel kernel) {
  cudaFuncAttributes attributes{};
  FA_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
  return attributes.ptxVersion >= 90 && attributes.binaryVersion >= 90;
}

// Launches kernel<<<grid, block, smem_bytes, stream>>>(args...), programmatically when
// `programmatic` (compiled_with_grid_wait of this kernel, found once per device by the caller).
template <class... Params, class... Args>
void launch_programmatic(void (*kernel)(Params...), dim3 grid, dim3 block, int smem_bytes, cudaStream_t stream,
                         bool programmatic, Args&&... args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = std::size_t(smem_bytes);
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = programmatic ? 1 : 0;
  FA_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

}  // namespace flashattn::cuda
