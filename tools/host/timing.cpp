#include "timing.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <cstdint>
#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

#ifdef FLASHATTN_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace flashattn::host {

#ifdef FLASHATTN_WITH_CUDA
static void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}
#endif

#ifdef FLASHATTN_WITH_CUDA
// Writing 256 MB before each timed run evicts the inputs from L2 (as triton's do_bench does),
// and keeps the GPU busy while the host launches the timed call, so the start event does not
// also count the host's launch time.
static void flush_l2() {
  static void* buffer = nullptr;
  constexpr std::size_t kBytes = 256u << 20;
  if (!buffer) check(cudaMalloc(&buffer, kBytes), "cudaMalloc");
  check(cudaMemsetAsync(buffer, 0, kBytes), "cudaMemsetAsync");
}
#endif

static double elapsed_ms(DeviceKind device, const std::function<void()>& fn) {
#ifdef FLASHATTN_WITH_CUDA
  if (device == DeviceKind::cuda) {
    cudaEvent_t start, stop;
    check(cudaEventCreate(&start), "cudaEventCreate");
    check(cudaEventCreate(&stop), "cudaEventCreate");
    flush_l2();
    check(cudaEventRecord(start), "cudaEventRecord");
    fn();
    check(cudaEventRecord(stop), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    return ms;
  }
#endif
  (void)device;
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

Timing time_runs(DeviceKind device, const std::function<void()>& fn, int warmup, int min_iterations,
                 double min_total_ms) {
  // Slow workloads (over ~100 ms a run) get one warm-up and stop after about 3 s of runs.
  for (int i = 0; i < warmup; ++i)
    if (elapsed_ms(device, fn) > 100) break;
  std::vector<double> times;
  double total = 0;
  while ((int(times.size()) < min_iterations && total < 3000) || total < min_total_ms) {
    times.push_back(elapsed_ms(device, fn));
    total += times.back();
    if (times.size() >= 10000) break;
  }
  std::sort(times.begin(), times.end());
  return {times[times.size() / 2], times.front(), int(times.size())};
}

std::size_t device_workspace_high_water() {
#ifdef FLASHATTN_WITH_CUDA
  int device = 0;
  cudaMemPool_t pool;
  if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetDefaultMemPool(&pool, device) != cudaSuccess) return 0;
  std::uint64_t high = 0;
  cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &high);
  return std::size_t(high);
#else
  return 0;
#endif
}

void reset_device_workspace_high_water() {
#ifdef FLASHATTN_WITH_CUDA
  int device = 0;
  cudaMemPool_t pool;
  if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetDefaultMemPool(&pool, device) != cudaSuccess) return;
  std::uint64_t zero = 0;
  cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero);
#endif
}

std::size_t host_peak_rss() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return std::size_t(usage.ru_maxrss) * 1024;
}

}  // namespace flashattn::host
