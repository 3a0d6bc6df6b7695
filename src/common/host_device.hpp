#pragma once
// Lets the small shared headers in src/common compile in both host and CUDA code.
#if defined(__CUDACC__)
#define FA_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FA_HOST_DEVICE inline
#endif
