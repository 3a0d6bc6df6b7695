#pragma once
// The smoke drivers' CUDA check: print the failed call and exit (they are programs, not
// gtests; the library itself throws through FA_CUDA_CHECK).
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CHECK_CUDA(x)                                                                \
  do {                                                                               \
    cudaError_t e_ = (x);                                                            \
    if (e_ != cudaSuccess) {                                                         \
      std::fprintf(stderr, "%s failed: %s (%s:%d)\n", #x, cudaGetErrorString(e_),   \
                   __FILE__, __LINE__);                                              \
      std::exit(2);                                                                  \
    }                                                                                \
  } while (0)
