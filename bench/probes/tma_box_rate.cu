// How fast one SM's TMA unit brings 16-key pages of a paged K cache into shared memory, by the
// shape of the boxes that carry them: to tell whether the sm90 paged forward's 16-key pages
// (two 2 KB boxes per page at head dim 128) are bound by a cost per TMA instruction or per byte
// (docs/kernels/kv-cache.md, "The sm90 forward over paged K/V").
//
// The pool is (pages, 16 rows, 8 KV heads, d = 128) in bf16, 16 MB, read again and again so that
// it stays in L2, as the forward's K/V blocks mostly do (every query tile of a head reads them).
// One CTA per SM; one thread streams groups of 8 random pages of one head (a 128-key block, 32 KB)
// into a ring of 4 groups, each group's copies completing on one mbarrier, as the forward's
// producer does without the consumers. Variants, by the copies of one page:
//   A  two boxes of 16 rows x 64 columns (128-byte swizzle): what the paged kernel issues for K
//      (and, before its V loader, issued for V too);
//   B  one box of (64 columns, 8 rows, 2 column halves, 2 row groups) over a 5-D view whose third
//      dimension runs over heads x halves: 4 KB in one instruction, laid out as swizzle atoms
//      ordered along the head dim first;
//   D  one box of 16 rows x 128 columns without swizzle (4 KB, 256-byte rows; wgmma could not
//      read it): does the swizzle matter;
//   E  four boxes of 8 rows x 64 columns (1 KB each);
//   C  (reference) pages of 128 rows: a block is two boxes of 128 rows x 64 columns (16 KB each),
//      the contiguous kernel's copies;
//   G  no TMA: the CTA's 128 threads copy every page with 16-byte cp.async (the same swizzled
//      places as A), each thread's copies completing on the group's mbarrier;
//   H  both paths at once: thread 0 issues A's boxes for half of a group's pages, warps 1-3 copy the
//      other half with cp.async.
//   I  H with B's boxes: thread 0 issues one 4 KB box for each of half the pages, warps 1-3 copy the
//      other half with cp.async (a paged forward's K by 5-D boxes beside V's rows);
//   J  I with five of the eight pages by B's boxes and three by cp.async (two of V's pages moved to
//      boxes as well).
//   M  clusters of two CTAs that read the same pages (two query heads of one KV head): each CTA
//      issues A's boxes for half of a group's pages and multicasts them to both, so each SM
//      issues half the boxes and still receives every byte. A ring slot is reused once both
//      CTAs have their bytes (an empty barrier per slot, arrived on from both CTAs). Does the
//      boxes' cost lie with the SM that issues them or with the one that receives them?
// Prints cycles per group and per TMA instruction (SM clock, mean over CTAs; for G the per-
// instruction figure counts thread copies) and the SMs' total rate.
//
// Build and run (Hopper):
//   nvcc -O3 -std=c++17 -arch=sm_90a -o tma_box_rate tma_box_rate.cu -lcuda
//   ./tma_box_rate
#include <cuda.h>

#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include <cuda_runtime.h>

#include "probe_check.cuh"

namespace {

constexpr int kHeadsKv = 8, kHeadDim = 128, kPageRows = 16, kGroupPages = 8;
constexpr int kPoolPages = 16 * 1024 * 1024 / (kPageRows * kHeadsKv * kHeadDim * 2);  // 16 MB
constexpr int kGroupBytes = kGroupPages * kPageRows * kHeadDim * 2;                // 32 KB
constexpr int kRing = 4;
constexpr int kGroups = 4096;  // per CTA

enum Variant { kA, kB, kD, kE, kC, kG, kH, kI, kJ, kM };

// Pages of a group that thread 0 copies by TMA (the rest by cp.async rows).
__host__ __device__ constexpr int tma_pages_of(int variant) {
  return variant == kH || variant == kI ? kGroupPages / 2 : variant == kJ ? 5 : variant == kG ? 0 : kGroupPages;
}

__device__ void wait_phase(uint32_t bar, uint32_t phase) {
  asm volatile(
      "{\n\t.reg .pred p;\n\tLAB_WAIT:\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n\t"
      "@!p bra LAB_WAIT;\n\t}" ::"r"(bar),
      "r"(phase));
}

__device__ void load4(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], [%2];"
      ::"r"(dst), "l"(map), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

__device__ void load5(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1, int c2, int c3, int c4) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6, %7}], "
      "[%2];" ::"r"(dst),
      "l"(map), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4)
      : "memory");
}

// Page `page`'s rows of head `head` into dst by 16-byte cp.async, piece i = thread, thread + threads,
// ...: the same bytes and swizzled places as variant A's two boxes.
__device__ void copy_page_rows(uint32_t dst, const unsigned char* pool, int page, int head, int thread, int threads) {
  constexpr int kPieces = kPageRows * kHeadDim * 2 / 16;  // 16 rows x 16 pieces
  for (int i = thread; i < kPieces; i += threads) {
    const int r = i / 16, c = i % 16, half = c / 8, j = c % 8;
    const unsigned char* src = pool + ((size_t(page) * kPageRows + r) * kHeadsKv + head) * (kHeadDim * 2) + c * 16;
    const uint32_t d = dst + half * 2048 + r * 128 + ((j ^ (r % 8)) * 16);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
  }
}

__global__ void __launch_bounds__(128) stream_pages(const __grid_constant__ CUtensorMap map, int variant,
                                                    const unsigned char* pool, const int* pages, long long* cycles) {
  extern __shared__ __align__(1024) unsigned char smem[];
  __shared__ __align__(8) uint64_t bars[kRing];
  const bool rows_too = variant == kG || variant == kH || variant == kI || variant == kJ;
  if (!rows_too && threadIdx.x != 0) return;
  const int row_threads = variant == kG ? 128 : 96, row_thread = variant == kG ? threadIdx.x : threadIdx.x - 32;
  const bool copies_rows = rows_too && row_thread >= 0;
  const bool issues_tma = threadIdx.x == 0 && variant != kG;
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  if (threadIdx.x == 0) {
    const int count = variant == kG ? 128 : rows_too ? 97 : 1;
    for (int i = 0; i < kRing; ++i) {
      const uint32_t bar = static_cast<uint32_t>(__cvta_generic_to_shared(&bars[i]));
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count));
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  const int head = blockIdx.x % kHeadsKv;
  const int* my_pages = pages + size_t(blockIdx.x) * kGroups * kGroupPages;
  const long long start = clock64();
  for (int g = 0; g < kGroups; ++g) {
    const int slot = g % kRing;
    const uint32_t bar = static_cast<uint32_t>(__cvta_generic_to_shared(&bars[slot]));
    if (g >= kRing && (issues_tma || copies_rows)) wait_phase(bar, (g / kRing - 1) & 1);
    const uint32_t dst = base + slot * kGroupBytes;
    if (copies_rows) {
      for (int i = tma_pages_of(variant); i < kGroupPages; ++i)
        copy_page_rows(dst + i * (kGroupBytes / kGroupPages), pool, my_pages[g * kGroupPages + i], head, row_thread,
                       row_threads);
      asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
    }
    if (!issues_tma) continue;
    const int tma_pages = tma_pages_of(variant);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar),
                 "r"(tma_pages * (kGroupBytes / kGroupPages))
                 : "memory");
    if (variant == kC) {  // pages of 128 rows: (col, row, head, page/8)
      const int page = my_pages[g * kGroupPages] / kGroupPages;
      load4(dst, &map, bar, 0, 0, head, page);
      load4(dst + kGroupBytes / 2, &map, bar, 64, 0, head, page);
      continue;
    }
    for (int i = 0; i < tma_pages; ++i) {
      const int page = my_pages[g * kGroupPages + i];
      const uint32_t d = dst + i * (kGroupBytes / kGroupPages);
      switch (variant) {
        case kA:
        case kH:
          load4(d, &map, bar, 0, 0, head, page);
          load4(d + 2048, &map, bar, 64, 0, head, page);
          break;
        case kB:
        case kI:
        case kJ:
          load5(d, &map, bar, 0, 0, 2 * head, 0, page);
          break;
        case kD:
          load4(d, &map, bar, 0, 0, head, page);
          break;
        case kE:
          for (int q = 0; q < 4; ++q) load4(d + 1024 * q, &map, bar, 64 * (q & 1), 8 * (q >> 1), head, page);
          break;
      }
    }
  }
  if (issues_tma || copies_rows)
    for (int g = kGroups; g < kGroups + kRing; ++g) {
      const uint32_t bar = static_cast<uint32_t>(__cvta_generic_to_shared(&bars[g % kRing]));
      wait_phase(bar, (g / kRing - 1) & 1);
    }
  if (threadIdx.x == 0) cycles[blockIdx.x] = clock64() - start;
}

__device__ void load4_multicast(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1, int c2, int c3,
                                uint16_t ctas) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%3, "
      "%4, %5, %6}], [%2], %7;" ::"r"(dst),
      "l"(map), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "h"(ctas)
      : "memory");
}

// Variant M: a cluster of two CTAs streams the same groups of pages (the cluster's), each issuing
// the boxes of every other page with multicast to both.
__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(128)
    stream_pages_multicast(const __grid_constant__ CUtensorMap map, const int* pages, long long* cycles) {
  extern __shared__ __align__(1024) unsigned char smem[];
  __shared__ __align__(8) uint64_t full[kRing];
  __shared__ __align__(8) uint64_t empty[kRing];
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  if (threadIdx.x == 0) {
    for (int i = 0; i < kRing; ++i) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(&full[i]))));
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 2;" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(&empty[i]))));
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
  if (threadIdx.x == 0) {
    const int cluster = blockIdx.x / 2;
    const int head = cluster % kHeadsKv;
    const int* my_pages = pages + size_t(cluster) * kGroups * kGroupPages;
    const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    // Tells both CTAs that this one has slot's bytes (its full barrier's phase is complete).
    auto release_slot = [&](int slot) {
      const uint32_t local = static_cast<uint32_t>(__cvta_generic_to_shared(&empty[slot]));
      for (uint32_t cta = 0; cta < 2; ++cta) {
        uint32_t remote;
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(cta));
        asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
      }
    };
    const long long start = clock64();
    for (int g = 0; g < kGroups; ++g) {
      const int slot = g % kRing;
      const uint32_t bar = static_cast<uint32_t>(__cvta_generic_to_shared(&full[slot]));
      if (g >= kRing) {
        wait_phase(bar, (g / kRing - 1) & 1);
        release_slot(slot);
        wait_phase(static_cast<uint32_t>(__cvta_generic_to_shared(&empty[slot])), (g / kRing - 1) & 1);
      }
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(kGroupBytes) : "memory");
      const uint32_t dst = base + slot * kGroupBytes;
      for (int i = int(rank); i < kGroupPages; i += 2) {
        const int page = my_pages[g * kGroupPages + i];
        const uint32_t d = dst + i * (kGroupBytes / kGroupPages);
        load4_multicast(d, &map, bar, 0, 0, head, page, 0x3);
        load4_multicast(d + 2048, &map, bar, 64, 0, head, page, 0x3);
      }
    }
    for (int g = kGroups; g < kGroups + kRing; ++g) {
      const int slot = g % kRing;
      wait_phase(static_cast<uint32_t>(__cvta_generic_to_shared(&full[slot])), (g / kRing - 1) & 1);
      release_slot(slot);
    }
    cycles[blockIdx.x] = clock64() - start;
  }
  // No CTA leaves while its peer may still write into its shared memory or arrive on its barriers.
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// dims / strides in elements (strides of dims 1..rank-1), box in elements.
CUtensorMap make_map(void* pool, int rank, const uint64_t* dims, const uint64_t* strides_elems, const uint32_t* box,
                     CUtensorMapSwizzle swizzle) {
  CUtensorMap map;
  uint64_t strides[4];
  for (int i = 0; i + 1 < rank; ++i) strides[i] = strides_elems[i] * 2;
  uint32_t elem_strides[5] = {1, 1, 1, 1, 1};
  const CUresult r = cuTensorMapEncodeTiled(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, rank, pool, dims, strides, box, elem_strides,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled failed: %d\n", int(r));
    std::exit(1);
  }
  return map;
}

}  // namespace

int main() {
  int sms = 0, clock_khz = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  const size_t pool_elems = size_t(kPoolPages) * kPageRows * kHeadsKv * kHeadDim;
  void* pool = nullptr;
  CHECK(cudaMalloc(&pool, pool_elems * 2));
  CHECK(cudaMemset(pool, 0x3c, pool_elems * 2));
  std::vector<int> pages(size_t(sms) * kGroups * kGroupPages);
  std::mt19937 rng(1234);
  for (int& p : pages) p = int(rng() % kPoolPages);
  int* d_pages = nullptr;
  long long* d_cycles = nullptr;
  CHECK(cudaMalloc(&d_pages, pages.size() * sizeof(int)));
  CHECK(cudaMemcpy(d_pages, pages.data(), pages.size() * sizeof(int), cudaMemcpyHostToDevice));
  CHECK(cudaMalloc(&d_cycles, sms * sizeof(long long)));
  const int smem = kRing * kGroupBytes;
  CHECK(cudaFuncSetAttribute(stream_pages, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CHECK(cudaFuncSetAttribute(stream_pages_multicast, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));

  const uint64_t row = uint64_t(kHeadsKv) * kHeadDim;  // elements between a head's rows
  const uint64_t page = kPageRows * row;
  struct Case {
    const char* name;
    int variant, rank, instrs;  // instructions per group
    uint64_t dims[5], strides[4];
    uint32_t box[5];
    CUtensorMapSwizzle swizzle;
  } cases[] = {
      {"A 2x(16 rows x 64 cols), 2 KB", kA, 4, 16, {kHeadDim, kPageRows, kHeadsKv, kPoolPages}, {row, kHeadDim, page},
       {64, kPageRows, 1, 1}, CU_TENSOR_MAP_SWIZZLE_128B},
      {"B 1x(64 cols, 8 rows, 2 halves, 2 row groups), 4 KB", kB, 5, 8,
       {64, 8, uint64_t(kHeadsKv) * kHeadDim / 64, kPageRows / 8, kPoolPages}, {row, 64, 8 * row, page},
       {64, 8, kHeadDim / 64, kPageRows / 8, 1}, CU_TENSOR_MAP_SWIZZLE_128B},
      {"D 1x(16 rows x 128 cols) unswizzled, 4 KB", kD, 4, 8, {kHeadDim, kPageRows, kHeadsKv, kPoolPages},
       {row, kHeadDim, page}, {kHeadDim, kPageRows, 1, 1}, CU_TENSOR_MAP_SWIZZLE_NONE},
      {"E 4x(8 rows x 64 cols), 1 KB", kE, 4, 32, {kHeadDim, kPageRows, kHeadsKv, kPoolPages}, {row, kHeadDim, page},
       {64, 8, 1, 1}, CU_TENSOR_MAP_SWIZZLE_128B},
      {"C 2x(128 rows x 64 cols), 16 KB (pages of 128)", kC, 4, 2,
       {kHeadDim, kPageRows * kGroupPages, kHeadsKv, kPoolPages / kGroupPages}, {row, kHeadDim, page * kGroupPages},
       {64, kPageRows * kGroupPages, 1, 1}, CU_TENSOR_MAP_SWIZZLE_128B},
      {"G cp.async 16 B, 128 threads", kG, 4, 2048, {kHeadDim, kPageRows, kHeadsKv, kPoolPages},
       {row, kHeadDim, page}, {64, kPageRows, 1, 1}, CU_TENSOR_MAP_SWIZZLE_128B},
      {"H half A boxes (thread 0) + half cp.async (96 threads)", kH, 4, 8, {kHeadDim, kPageRows, kHeadsKv, kPoolPages},
       {row, kHeadDim, page}, {64, kPageRows, 1, 1}, CU_TENSOR_MAP_SWIZZLE_128B},
      {"I half B boxes (thread 0) + half cp.async (96 threads)", kI, 5, 4,
       {64, 8, uint64_t(kHeadsKv) * kHeadDim / 64, kPageRows / 8, kPoolPages}, {row, 64, 8 * row, page},
       {64, 8, kHeadDim / 64, kPageRows / 8, 1}, CU_TENSOR_MAP_SWIZZLE_128B},
      {"J 5/8 B boxes (thread 0) + 3/8 cp.async (96 threads)", kJ, 5, 5,
       {64, 8, uint64_t(kHeadsKv) * kHeadDim / 64, kPageRows / 8, kPoolPages}, {row, 64, 8 * row, page},
       {64, 8, kHeadDim / 64, kPageRows / 8, 1}, CU_TENSOR_MAP_SWIZZLE_128B},
      {"M A's boxes, half a group per CTA, multicast to a pair", kM, 4, 8, {kHeadDim, kPageRows, kHeadsKv, kPoolPages},
       {row, kHeadDim, page}, {64, kPageRows, 1, 1}, CU_TENSOR_MAP_SWIZZLE_128B},
  };
  std::printf("%d SMs, %d MHz max clock; pool %d MB, %d groups of %d KB per SM\n", sms, clock_khz / 1000,
              int(pool_elems * 2 >> 20), kGroups, kGroupBytes / 1024);
  cudaEvent_t t0, t1;
  CHECK(cudaEventCreate(&t0));
  CHECK(cudaEventCreate(&t1));
  std::vector<long long> cycles(sms);
  for (int round = 0; round < 2; ++round) {
    for (const Case& c : cases) {
      const CUtensorMap map = make_map(pool, c.rank, c.dims, c.strides, c.box, c.swizzle);
      auto launch = [&] {
        if (c.variant == kM)
          stream_pages_multicast<<<sms / 2 * 2, 128, smem>>>(map, d_pages, d_cycles);
        else
          stream_pages<<<sms, 128, smem>>>(map, c.variant, static_cast<const unsigned char*>(pool), d_pages, d_cycles);
      };
      launch();  // warm L2
      CHECK(cudaGetLastError());
      CHECK(cudaEventRecord(t0));
      launch();
      CHECK(cudaEventRecord(t1));
      CHECK(cudaEventSynchronize(t1));
      float ms = 0;
      CHECK(cudaEventElapsedTime(&ms, t0, t1));
      CHECK(cudaMemcpy(cycles.data(), d_cycles, sms * sizeof(long long), cudaMemcpyDeviceToHost));
      double mean = 0;
      for (long long v : cycles) mean += double(v) / sms;
      const double per_group = mean / kGroups;
      std::printf("round %d  %-52s %7.0f cycles/group %6.0f /instr  %5.1f B/cycle/SM  %6.2f TB/s  %.3f ms\n", round,
                  c.name, per_group, per_group / c.instrs, kGroupBytes / per_group,
                  double(sms) * kGroups * kGroupBytes / (ms * 1e-3) / 1e12, ms);
    }
  }
  CHECK(cudaFree(pool));
  CHECK(cudaFree(d_pages));
  CHECK(cudaFree(d_cycles));
  return 0;
}
