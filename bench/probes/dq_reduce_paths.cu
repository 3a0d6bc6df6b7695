// How fast the L2 takes the sm90 backward's fp32 dQ additions at head dim 256, by the path they
// take: 16-byte reductions from registers (red.global.add.v4.f32, what the head-dim-split consumer
// issues) or one bulk reduce-add per warpgroup half from shared memory
// (cp.reduce.async.bulk .add.f32, what the d <= 128 dQ writer issues), with the CTAs walking the
// query blocks of a head together (as the kernel's tiles do) or each from its own starting block.
// It asks whether the d = 256 backward's adds cost more per byte than a bulk path would
// (docs/kernels/sm90-backward.md, "What limits it"), with nothing of the attention kernel around.
//
// The pattern is the kernel's: 132 persistent CTAs of two 128-thread warpgroups; a tile is one
// (head, key block) and walks every query block of its head; per step each warpgroup adds 64 x 128
// fp32 (32 KB) into its half of the step's 64 KB dQ block, thread t's i-th group of four at
// (i * 128 + t) * 4 (the accumulator's fragment order). 16 heads x 128 query blocks (n = 8k): the
// accumulator is 128 MB, every element receives 128 additions of 1.0, checked after each mode.
//
// Build and run (Hopper):
//   nvcc -O3 -arch=sm_90a -o dq_reduce_paths dq_reduce_paths.cu
//   ./dq_reduce_paths
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_runtime.h>

#include "probe_check.cuh"

namespace {

constexpr int kHeads = 16, kBlocks = 128;       // query blocks a head; key blocks a head too
constexpr int kHalfFloats = 64 * 128;           // one warpgroup's half of a dQ block
constexpr int kBlockFloats = 2 * kHalfFloats;   // 64 rows x 256
constexpr int kThreads = 256, kStages = 2;
constexpr int kSmemBytes = kStages * 2 * kHalfFloats * 4;  // two stages per warpgroup

enum Mode { kRegisters, kBulk, kStores };
const char* mode_name(int m) { return m == kRegisters ? "red.v4 from registers" : m == kBulk ? "bulk reduce from smem" : "st.global.v4 (not adds)"; }

__device__ void red_v4(float* dst, float v) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %1, %1, %1};\n" ::"l"(dst), "f"(v) : "memory");
}

template <int kMode>
__global__ void __launch_bounds__(kThreads) add_dq(float* acc, bool rotate, float value) {
  extern __shared__ __align__(128) float smem[];
  const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
  int step = 0;
  for (int tile = blockIdx.x; tile < kHeads * kBlocks; tile += gridDim.x) {
    const int head = tile / kBlocks, n_block = tile % kBlocks;
    for (int s = 0; s < kBlocks; ++s, ++step) {
      const int m = rotate ? (s + n_block) % kBlocks : s;
      float* dst = acc + (size_t(head) * kBlocks + m) * kBlockFloats + wg * kHalfFloats;
      if constexpr (kMode == kRegisters) {
#pragma unroll
        for (int i = 0; i < kHalfFloats / 512; ++i) red_v4(dst + (i * 128 + t) * 4, value);
      } else if constexpr (kMode == kStores) {
#pragma unroll
        for (int i = 0; i < kHalfFloats / 512; ++i)
          reinterpret_cast<float4*>(dst)[i * 128 + t] = make_float4(value, value, value, value);
      } else {
        float* stage = smem + (wg * kStages + step % kStages) * kHalfFloats;
        // The stage's previous bulk add (kStages steps ago) must have read it.
        if (t == 0) asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kStages - 1) : "memory");
        asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg) : "memory");
#pragma unroll
        for (int i = 0; i < kHalfFloats / 512; ++i)
          reinterpret_cast<float4*>(stage)[i * 128 + t] = make_float4(value, value, value, value);
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg) : "memory");
        if (t == 0) {
          const unsigned src = static_cast<unsigned>(__cvta_generic_to_shared(stage));
          asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
                       "r"(src), "r"(kHalfFloats * 4)
                       : "memory");
          asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
        }
      }
    }
  }
  if constexpr (kMode == kBulk)
    if (threadIdx.x % 128 == 0) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

template <int kMode>
float run(float* acc, bool rotate, int grid, int reps, bool check) {
  const size_t floats = size_t(kHeads) * kBlocks * kBlockFloats;
  CHECK(cudaFuncSetAttribute(add_dq<kMode>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  float best = 1e30f;
  for (int r = 0; r < reps; ++r) {
    CHECK(cudaMemset(acc, 0, floats * 4));
    CHECK(cudaEventRecord(start));
    add_dq<kMode><<<grid, kThreads, kSmemBytes>>>(acc, rotate, 1.0f);
    CHECK(cudaEventRecord(stop));
    CHECK(cudaEventSynchronize(stop));
    CHECK(cudaGetLastError());
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    best = ms < best ? ms : best;
  }
  if (check) {
    std::vector<float> host(floats);
    CHECK(cudaMemcpy(host.data(), acc, floats * 4, cudaMemcpyDeviceToHost));
    const float expected = kMode == kStores ? 1.0f : float(kBlocks);
    size_t wrong = 0;
    for (float v : host) wrong += v != expected;
    if (wrong) {
      std::fprintf(stderr, "%s: %zu of %zu elements wrong\n", mode_name(kMode), wrong, floats);
      std::exit(1);
    }
  }
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const bool once = argc > 1;  // one launch of each, for a profiler
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  const int grid = prop.multiProcessorCount;
  std::printf("# %s, %d CTAs; %d heads x %d key blocks x %d query blocks, 64 KB of fp32 adds a step;\n"
              "# GB/s = bytes added / time (best of %d), every element checked\n",
              prop.name, grid, kHeads, kBlocks, kBlocks, once ? 1 : 5);
  float* acc = nullptr;
  const size_t floats = size_t(kHeads) * kBlocks * kBlockFloats;
  CHECK(cudaMalloc(&acc, floats * 4));
  const double bytes = double(kHeads) * kBlocks * kBlocks * kBlockFloats * 4;
  std::printf("%-26s %-9s %9s %9s\n", "path", "walk", "ms", "GB/s");
  for (bool rotate : {false, true}) {
    const char* walk = rotate ? "rotated" : "together";
    const int reps = once ? 1 : 5;
    float ms = run<kRegisters>(acc, rotate, grid, reps, !once);
    std::printf("%-26s %-9s %9.3f %9.0f\n", mode_name(kRegisters), walk, ms, bytes / (ms * 1e-3) / 1e9);
    ms = run<kBulk>(acc, rotate, grid, reps, !once);
    std::printf("%-26s %-9s %9.3f %9.0f\n", mode_name(kBulk), walk, ms, bytes / (ms * 1e-3) / 1e9);
    ms = run<kStores>(acc, rotate, grid, reps, !once);
    std::printf("%-26s %-9s %9.3f %9.0f\n", mode_name(kStores), walk, ms, bytes / (ms * 1e-3) / 1e9);
  }
  CHECK(cudaFree(acc));
  return 0;
}
