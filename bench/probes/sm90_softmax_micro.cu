// How long the sm90 forward's per-block softmax takes outside the kernel: one
// DeferredOnlineSoftmax step on a 64 x 128 block (a warpgroup's wgmma accumulator layout, 64
// scores per thread) plus the conversion of P to bf16, repeated in registers. Cases (one CTA per
// SM, so warpgroup w's warps share the sub-partitions with the other warpgroups'):
//   alone xN    N warpgroups all running the softmax loop;
//   + SS gemm   warpgroup 0 runs it while warpgroup 1 keeps the tensor cores busy with
//               64 x 128 x 128 wgmmas from shared memory (like QK^T);
//   + RS gemm   the same with A from registers (like P.V);
//   own P.V     warpgroup 0 alone, issuing a 64 x 128 x 128 RS wgmma before each softmax step and
//               waiting for it after (the forward's pattern within a block).
// A baseline loop without the softmax step is timed alike; "step" (the library's
// DeferredOnlineSoftmax::step) is the difference, as are steps written out here that leave out
// the row sum, the row max, or both (exp2 only), to show what each part costs.
//
// Build and run on an H100 (a measuring tool for docs/log/sm90-forward.md, 2026-11-23: the softmax
// measured outside the kernel; not part of the CMake build):
//   nvcc -std=c++17 -arch=sm_90a -O3 --use_fast_math --expt-relaxed-constexpr \
//     -Isrc -I.deps/cutlass/include bench/probes/sm90_softmax_micro.cu -o /tmp/softmax_micro && /tmp/softmax_micro
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cute/tensor.hpp>
#include <cutlass/numeric_conversion.h>

#include "cuda/common/online_softmax_deferred.cuh"
#include "cuda/sm90/gmma_fragment.cuh"

#include "probe_check.cuh"

namespace softmax_micro {

using namespace cute;
using Element = cutlass::bfloat16_t;
constexpr int kIters = 256;

enum class Mode { alone, with_ss_gemm, with_rs_gemm, own_pv };

using MmaSS = decltype(make_tiled_mma(GMMA::ss_op_selector<Element, Element, float, Shape<_64, _128, _128>>()));
using MmaRS = decltype(make_tiled_mma(GMMA::rs_op_selector<Element, Element, float, Shape<_64, _128, _128>,
                                                           GMMA::Major::K, GMMA::Major::MN>()));
using SmemA = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{}, Shape<_64, _128>{}));
using SmemB = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{}, Shape<_128, _128>{}));
using SmemBt = decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<Element>{}, Shape<_128, _128>{}));
constexpr int kSmemBytes = (64 * 128 + 128 * 128) * 2 + 1024;

// Keeps the tensor cores busy with one warpgroup's wgmmas for longer than warpgroup 0's loop
// (a fixed count: every warp of the warpgroup must issue the same wgmmas).
constexpr int kPartnerGemms = 1024;  // 64 x 128 x 128 each, ~512 cycles at the tensor cores' peak
template <bool kRegistersA>
__device__ void gemm_partner(Element* sa, Element* sb, float* sink) {
  const int lane = threadIdx.x % 128;
  Tensor acc = partition_fragment_C(MmaSS{}, Shape<_64, _128>{});
  clear(acc);
  if constexpr (kRegistersA) {
    MmaRS mma;
    auto thr = mma.get_thread_slice(lane);
    Tensor tB = thr.partition_fragment_B(make_tensor(make_smem_ptr(sb), SmemBt{}));
    Tensor a = make_tensor<Element>(flashattn::cuda::sm90::gmma_accumulator_as_a_layout(acc.layout()));
    for (int i = 0; i < size(a); ++i) a(i) = Element(0.01f * (i % 5));
    for (int g = 0; g < kPartnerGemms; ++g) {
      flashattn::cuda::sm90::warpgroup_gemm<false>(mma, a, tB, acc);
      warpgroup_wait<0>();
    }
  } else {
    MmaSS mma;
    auto thr = mma.get_thread_slice(lane);
    Tensor tA = thr.partition_fragment_A(make_tensor(make_smem_ptr(sa), SmemA{}));
    Tensor tB = thr.partition_fragment_B(make_tensor(make_smem_ptr(sb), SmemB{}));
    for (int g = 0; g < kPartnerGemms; ++g) {
      flashattn::cuda::sm90::warpgroup_gemm<false>(mma, tA, tB, acc);
      warpgroup_wait<0>();
    }
  }
  float s = 0.f;
  for (int i = 0; i < size(acc); ++i) s += acc(i);
  sink[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

// The softmax step with parts left out, to see what each costs (not a correct softmax unless
// both flags are set): kMax, the row max over the block and the quad; kSum, the row sum.
template <bool kMax, bool kSum, class Scores>
__device__ float partial_step(Scores& scores, float (&row_max)[2], float (&row_sum)[2], float scale_log2) {
  float factors = 0.f;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float new_max = row_max[r];
    if constexpr (kMax) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int c = 0; c < size<1>(scores); ++c) tile_max = fmaxf(tile_max, scores(r, c));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      new_max = fmaxf(row_max[r], tile_max);
    }
    const float offset = new_max * scale_log2;
    const float factor = exp2f(row_max[r] * scale_log2 - offset);
    factors += factor;
    row_max[r] = new_max;
    float sum = 0.f;
#pragma unroll
    for (int c = 0; c < size<1>(scores); ++c) {
      const float p = exp2f(fmaf(scores(r, c), scale_log2, -offset));
      scores(r, c) = p;
      if constexpr (kSum) sum += p;
    }
    row_sum[r] = row_sum[r] * factor + sum;
  }
  return factors;
}

enum class Step { none, library, no_sum, no_max, neither };

template <Mode kMode, Step kStepKind>
__global__ void softmax_loop(float scale_log2, float* sink, long long* cycles) {
  extern __shared__ __align__(1024) char smem[];
  Element* sa = reinterpret_cast<Element*>((reinterpret_cast<uintptr_t>(smem) + 1023) / 1024 * 1024);
  Element* sb = sa + 64 * 128;
  for (int i = threadIdx.x; i < 64 * 128 + 128 * 128; i += blockDim.x) sa[i] = Element(0.001f * (i % 7));
  __syncthreads();
  const int warp_group = threadIdx.x / 128;
  constexpr bool kGemmPartner = kMode == Mode::with_ss_gemm || kMode == Mode::with_rs_gemm;
  if (kGemmPartner && warp_group == 1) {
    gemm_partner<kMode == Mode::with_rs_gemm>(sa, sb, sink);
    return;
  }

  Tensor acc = partition_fragment_C(MmaSS{}, Shape<_64, _128>{});
  Tensor scores = flashattn::cuda::sm90::gmma_rowcol(acc);
  constexpr int kSize = decltype(size(acc))::value;
  for (int i = 0; i < kSize; ++i) acc(i) = float((threadIdx.x * 7 + i * 13) % 97) * 0.05f;
  flashattn::cuda::DeferredOnlineSoftmax<2> softmax(scale_log2);
  cutlass::NumericArrayConverter<Element, float, kSize> to_p;
  float factor_sum = 0.f;
  float row_max[2] = {8.f, 8.f}, row_sum[2] = {0.f, 0.f};  // partial_step's state
  // own_pv: O += P V in flight during each step, as in the forward's middle blocks.
  MmaRS mma_pv;
  Tensor tOrV = mma_pv.get_thread_slice(threadIdx.x % 128).partition_fragment_B(make_tensor(make_smem_ptr(sb), SmemBt{}));
  Tensor out = partition_fragment_C(mma_pv, Shape<_64, _128>{});
  clear(out);
  Tensor tOrP = make_tensor<Element>(flashattn::cuda::sm90::gmma_accumulator_as_a_layout(acc.layout()));
  for (int i = 0; i < size(tOrP); ++i) tOrP(i) = Element(0.f);

  const long long start = clock64();
  for (int it = 0; it < kIters; ++it) {
    if constexpr (kMode == Mode::own_pv) flashattn::cuda::sm90::warpgroup_gemm<false>(mma_pv, tOrP, tOrV, out);
    if constexpr (kStepKind == Step::library) {
      auto corr = softmax.template step<false>(scores);
      factor_sum += corr.factor[0] + corr.factor[1];
    } else if constexpr (kStepKind == Step::no_sum) {
      factor_sum += partial_step<true, false>(scores, row_max, row_sum, scale_log2);
    } else if constexpr (kStepKind == Step::no_max) {
      factor_sum += partial_step<false, true>(scores, row_max, row_sum, scale_log2);
    } else if constexpr (kStepKind == Step::neither) {
      factor_sum += partial_step<false, false>(scores, row_max, row_sum, scale_log2);
    }
    if constexpr (kMode == Mode::own_pv) warpgroup_wait<0>();
    *reinterpret_cast<cutlass::Array<Element, kSize>*>(tOrP.data()) =
        to_p(*reinterpret_cast<cutlass::Array<float, kSize> const*>(acc.data()));
    // The next block's logits depend on this one's P, so nothing is hoisted out of the loop.
    for (int i = 0; i < kSize; ++i) acc(i) = fmaf(float(tOrP(i)), 9.f, float(i & 7) - 4.f + 0.001f * it);
  }
  const long long stop_clock = clock64();

  float s = factor_sum + row_sum[0] + row_sum[1] + row_max[0] + row_max[1];
  for (int i = 0; i < kSize; ++i) s += acc(i);
  for (int i = 0; i < size(out); ++i) s += out(i);
  sink[blockIdx.x * blockDim.x + threadIdx.x] = s;
  if (threadIdx.x % 32 == 0 && warp_group == 0) cycles[blockIdx.x * 4 + threadIdx.x / 32] = stop_clock - start;
}

template <Mode kMode, Step kStep>
double median_cycles_per_iter(int warp_groups, int sms) {
  const int threads = 128 * warp_groups;
  float* sink;
  long long* cycles;
  CHECK(cudaMalloc(&sink, sizeof(float) * sms * threads));
  CHECK(cudaMalloc(&cycles, sizeof(long long) * sms * 4));
  auto kernel = softmax_loop<kMode, kStep>;
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  for (int rep = 0; rep < 3; ++rep) {  // the last run counts
    kernel<<<sms, threads, kSmemBytes>>>(0.125f * 1.4427f, sink, cycles);
    CHECK(cudaGetLastError());
  }
  CHECK(cudaDeviceSynchronize());
  std::vector<long long> c(sms * 4);
  CHECK(cudaMemcpy(c.data(), cycles, sizeof(long long) * c.size(), cudaMemcpyDeviceToHost));
  CHECK(cudaFree(sink));
  CHECK(cudaFree(cycles));
  std::sort(c.begin(), c.end());
  return double(c[c.size() / 2]) / kIters;
}

template <Mode kMode>
void report(const char* name, int warp_groups, int sms) {
  const double baseline = median_cycles_per_iter<kMode, Step::none>(warp_groups, sms);
  const double full = median_cycles_per_iter<kMode, Step::library>(warp_groups, sms);
  const double no_sum = median_cycles_per_iter<kMode, Step::no_sum>(warp_groups, sms);
  const double no_max = median_cycles_per_iter<kMode, Step::no_max>(warp_groups, sms);
  const double neither = median_cycles_per_iter<kMode, Step::neither>(warp_groups, sms);
  std::printf("%-14s %9.0f %9.0f %9.0f %9.0f %9.0f %9.0f\n", name, full, baseline, full - baseline,
              no_sum - baseline, no_max - baseline, neither - baseline);
}

}  // namespace softmax_micro

int main() {
  using namespace softmax_micro;
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::printf("softmax of a 64 x 128 block per warpgroup (64 scores per thread), %d iterations, one CTA\n"
              "per SM (%d); SM cycles per iteration of warpgroup 0, median over its warps and the CTAs\n",
              kIters, sms);
  std::printf("%-14s %9s %9s %9s %9s %9s %9s\n", "case", "loop", "baseline", "step", "no sum", "no max", "neither");
  report<Mode::alone>("alone x1", 1, sms);
  report<Mode::alone>("alone x2", 2, sms);
  report<Mode::alone>("alone x3", 3, sms);
  report<Mode::with_ss_gemm>("+ SS gemm", 2, sms);
  report<Mode::with_rs_gemm>("+ RS gemm", 2, sms);
  report<Mode::own_pv>("own P.V", 1, sms);
  return 0;
}
