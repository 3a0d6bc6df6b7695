#pragma once
// Turns CUDA failures into flashattn::Error (kind runtime).
#include <cuda_runtime.h>

#include <string>

#include "flashattn/error.hpp"

namespace flashattn::cuda {

[[noreturn]] inline void throw_cuda_error(cudaError_t status, const char* what, const char* file,
                                          int line) {
  throw Error(ErrorKind::runtime, "cuda", std::string(what) + " to succeed",
              std::string(cudaGetErrorName(status)) + " (" + cudaGetErrorString(status) + ") at " +
                  file + ":" + std::to_string(line));
}

}  // namespace flashattn::cuda

#define FA_CUDA_CHECK(expr)                                                              \
  do {                                                                                   \
    cudaError_t fa_status_ = (expr);                                                     \
    if (fa_status_ != cudaSuccess)                                                       \
      ::flashattn::cuda::throw_cuda_error(fa_status_, #expr, __FILE__, __LINE__);        \
  } while (0)

// After a kernel launch: reports launch-configuration errors without synchronizing.
#define FA_CUDA_CHECK_LAUNCH() FA_CUDA_CHECK(cudaGetLastError())
