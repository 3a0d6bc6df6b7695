// What compute-sanitizer's racecheck reports for a hand-off through named barriers that the PTX
// memory model orders: the shape of the sm90 backward's d = 64 dQ staging
// (src/cuda/sm90/backward_consumer.cuh), without anything else of the kernel.
//
// One buffer in shared memory and three parties, per step:
//   group 1 (128 threads) waits until the buffer is free (barrier kEmpty), stores its values,
//           signals kStaged;
//   group 2 (128 threads) waits for kStaged, adds its values to the buffer, signals kFull;
//   the writer (one warp) frees the buffer (kEmpty), waits for kFull and reads the sum.
// Group 2's reads of step s come before group 1's stores of step s + 1 only through the writer
// (group 2 -> kFull -> writer -> kEmpty -> group 1): two barriers with different threads.
//
// Variant "arrive" (no argument): the signalling side uses bar.arrive, as the kernel does.
// Variant "sync" (any argument): every party waits at every barrier (bar.sync), the same order
// of the data. The result is checked either way (the writer's sums).
//
// Build and run (Hopper or any sm_70+ GPU with -arch adjusted):
//   nvcc -O2 -arch=sm_90a -lineinfo -o named_barrier_racecheck named_barrier_racecheck.cu
//   compute-sanitizer --tool racecheck ./named_barrier_racecheck [sync]
#include <cstdio>
#include <cuda_runtime.h>

namespace {

enum Barrier : int { kEmpty = 1, kStaged = 2, kFull = 3 };
constexpr int kValuesPerThread = 8;

__device__ void barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ void barrier_signal(int id, int threads, bool wait) {
  if (wait)
    barrier_sync(id, threads);
  else
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

__global__ void hand_off(float* sums, int steps, bool signal_waits) {
  __shared__ float buffer[128 * kValuesPerThread];
  const int warp = threadIdx.x / 32, group = threadIdx.x / 128, t = threadIdx.x % 128;
  if (group == 0) {
    if (warp != 1) return;  // the writer is warp 1
    for (int s = 0; s < steps; ++s) {
      barrier_signal(kEmpty, 128 + 32, signal_waits);
      barrier_sync(kFull, 128 + 32);
      sums[s * 32 + t % 32] = buffer[t % 32];
    }
  } else if (group == 1) {
    for (int s = 0; s < steps; ++s) {
      barrier_sync(kEmpty, 128 + 32);
      for (int i = 0; i < kValuesPerThread; ++i) buffer[i * 128 + t] = float(s + i);
      barrier_signal(kStaged, 256, signal_waits);
    }
  } else {
    for (int s = 0; s < steps; ++s) {
      barrier_sync(kStaged, 256);
      for (int i = 0; i < kValuesPerThread; ++i) buffer[i * 128 + t] += 1.0f;
      barrier_signal(kFull, 128 + 32, signal_waits);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bool signal_waits = argc > 1;
  std::printf("variant: %s\n", signal_waits ? "sync (every party waits)" : "arrive (the kernel's)");
  constexpr int kSteps = 8;
  float* sums = nullptr;
  if (cudaMalloc(&sums, kSteps * 32 * sizeof(float)) != cudaSuccess) return 2;
  hand_off<<<1, 384>>>(sums, kSteps, signal_waits);
  cudaError_t status = cudaDeviceSynchronize();
  float host[kSteps * 32];
  if (status == cudaSuccess) status = cudaMemcpy(host, sums, sizeof(host), cudaMemcpyDeviceToHost);
  if (status != cudaSuccess) {
    std::printf("CUDA error: %s\n", cudaGetErrorString(status));
    return 2;
  }
  int wrong = 0;  // thread t's first value of step s: s (group 1) + 1 (group 2)
  for (int s = 0; s < kSteps; ++s)
    for (int t = 0; t < 32; ++t) wrong += host[s * 32 + t] != float(s + 1);
  std::printf("sums: %s (%d wrong of %d)\n", wrong ? "WRONG" : "ok", wrong, kSteps * 32);
  cudaFree(sums);
  return wrong ? 1 : 0;
}
