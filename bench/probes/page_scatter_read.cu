// How fast a GPU reads a paged KV cache when the pages lie in order, scattered at random over
// the pool, or scattered only within each 2 MB region, with nothing of the attention kernel
// around the loads: to tell whether 16-token pages decode slower than a contiguous cache because
// of where their bytes lie (docs/kernels/kv-cache.md, "Where paged decoding loses its last few
// percent") and, if so, whether address translation (2 MB pages) or DRAM locality costs it.
//
// The loads are the decoding kernel's: K and V caches (num_pages, page_size, heads_kv, d) in
// bf16, a CTA per (key split, KV head, sequence) walking its keys in 128-row tiles, 16 threads
// per 256-byte row of its head. Every byte of both caches is read once per pass; the XOR of what
// a thread read goes to memory so that nothing is optimized away.
//
// Build and run (Hopper; another GPU with -arch adjusted):
//   nvcc -O3 -arch=sm_90a -o page_scatter_read page_scatter_read.cu
//   ./page_scatter_read            # batch 8, 8 KV heads, d = 128, KV 16k / 64k / 128k
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <vector>

#include <cuda_runtime.h>

#include "probe_check.cuh"

namespace {

constexpr int kBatch = 8, kHeadsKv = 8, kHeadDim = 128;
constexpr int kRowBytes = kHeadDim * 2;                  // one head's row of one token, bf16
constexpr int kThreadsPerRow = kRowBytes / 16;           // 16-byte loads
constexpr int kThreads = 128;
constexpr int kRowsPerLoad = kThreads / kThreadsPerRow;  // rows one load instruction covers
constexpr int kTileRows = 128;
constexpr int kLoadsPerTile = kTileRows / kRowsPerLoad;

struct Cache {
  const uint4* k;
  const uint4* v;
  const int* table;  // (batch, pages per sequence)
  int page_size, pages_per_seq, seqlen, splits;
};

__device__ const uint4* row_address(const uint4* pool, const Cache& c, int b, int h, int key) {
  const int page = c.table[b * c.pages_per_seq + key / c.page_size];
  const long long row = (long long)page * c.page_size + key % c.page_size;
  return pool + ((row * kHeadsKv + h) * kRowBytes) / 16;
}

__global__ void __launch_bounds__(kThreads) read_pages(Cache c, uint4* sink) {
  const int split = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int keys = c.seqlen / c.splits, first = split * keys;
  const int lane_row = threadIdx.x / kThreadsPerRow, lane_col = threadIdx.x % kThreadsPerRow;
  uint4 acc = make_uint4(0, 0, 0, 0);
  for (int tile = first; tile < first + keys; tile += kTileRows) {
    uint4 kv[2 * kLoadsPerTile];
#pragma unroll
    for (int i = 0; i < kLoadsPerTile; ++i) {
      const int key = tile + i * kRowsPerLoad + lane_row;
      kv[2 * i] = __ldg(row_address(c.k, c, b, h, key) + lane_col);
      kv[2 * i + 1] = __ldg(row_address(c.v, c, b, h, key) + lane_col);
    }
#pragma unroll
    for (int i = 0; i < 2 * kLoadsPerTile; ++i) {
      acc.x ^= kv[i].x;
      acc.y ^= kv[i].y;
      acc.z ^= kv[i].z;
      acc.w ^= kv[i].w;
    }
  }
  sink[((b * kHeadsKv + h) * gridDim.x + split) * kThreads + threadIdx.x] = acc;
}

enum class Placement { in_order, scattered, scattered_within_2mb };
const char* name(Placement p) {
  return p == Placement::in_order ? "in order" : p == Placement::scattered ? "scattered" : "scattered within 2 MB";
}

// Page numbers of every sequence, (batch, pages per sequence), over a pool of exactly that many.
std::vector<int> page_table(Placement placement, int pages, int page_bytes, std::mt19937& rng) {
  std::vector<int> table(pages);
  std::iota(table.begin(), table.end(), 0);
  if (placement == Placement::scattered) {
    std::shuffle(table.begin(), table.end(), rng);
  } else if (placement == Placement::scattered_within_2mb) {
    const int group = std::max(1, (2 << 20) / page_bytes);  // pages per 2 MB of one cache
    for (int g = 0; g < pages; g += group)
      std::shuffle(table.begin() + g, table.begin() + std::min(pages, g + group), rng);
  }
  return table;
}

float time_ms(const Cache& c, uint4* sink, int reps) {
  const dim3 grid(c.splits, kHeadsKv, kBatch);
  read_pages<<<grid, kThreads>>>(c, sink);  // warm-up
  CHECK(cudaGetLastError());
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  CHECK(cudaEventRecord(start));
  for (int r = 0; r < reps; ++r) read_pages<<<grid, kThreads>>>(c, sink);
  CHECK(cudaEventRecord(stop));
  CHECK(cudaEventSynchronize(stop));
  CHECK(cudaGetLastError());
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, start, stop));
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  return ms / reps;
}

}  // namespace

int main() {
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("# %s; batch %d, %d KV heads, d = %d, bf16 K and V caches; GB/s = both caches' bytes / time\n",
              prop.name, kBatch, kHeadsKv, kHeadDim);
  const int max_seqlen = 131072;
  const size_t cache_bytes = size_t(kBatch) * max_seqlen * kHeadsKv * kRowBytes;
  uint4 *k = nullptr, *v = nullptr, *sink = nullptr;
  int* table_dev = nullptr;
  CHECK(cudaMalloc(&k, cache_bytes));
  CHECK(cudaMalloc(&v, cache_bytes));
  CHECK(cudaMemset(k, 1, cache_bytes));
  CHECK(cudaMemset(v, 2, cache_bytes));
  CHECK(cudaMalloc(&sink, size_t(kBatch) * kHeadsKv * 64 * kThreads * sizeof(uint4)));
  CHECK(cudaMalloc(&table_dev, size_t(kBatch) * (max_seqlen / 16) * sizeof(int)));
  std::mt19937 rng(7);
  const Placement placements[] = {Placement::in_order, Placement::scattered, Placement::scattered_within_2mb};
  std::printf("%8s %5s %6s  %-22s %9s %9s %8s\n", "kv", "page", "splits", "placement", "us", "GB/s", "/order");
  for (int seqlen : {16384, 65536, 131072})
    for (int page_size : {16, 256})
      for (int splits : {4, 16}) {
        float in_order_ms = 0;
        for (Placement placement : placements) {
          const int pages = kBatch * (seqlen / page_size);
          const std::vector<int> table =
              page_table(placement, pages, page_size * kHeadsKv * kRowBytes, rng);
          CHECK(cudaMemcpy(table_dev, table.data(), table.size() * sizeof(int), cudaMemcpyHostToDevice));
          const Cache c{k, v, table_dev, page_size, seqlen / page_size, seqlen, splits};
          const float ms = time_ms(c, sink, 20);
          if (placement == Placement::in_order) in_order_ms = ms;
          const double bytes = 2.0 * kBatch * seqlen * kHeadsKv * kRowBytes;
          std::printf("%8d %5d %6d  %-22s %9.1f %9.0f %8.3f\n", seqlen, page_size, splits, name(placement), ms * 1e3,
                      bytes / (ms * 1e-3) / 1e9, in_order_ms / ms);
        }
      }
  CHECK(cudaFree(k));
  CHECK(cudaFree(v));
  CHECK(cudaFree(sink));
  CHECK(cudaFree(table_dev));
  return 0;
}
