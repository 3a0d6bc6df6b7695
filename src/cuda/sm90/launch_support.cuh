#pragma once
// Host-side helpers of the sm90 family's launches (forward and backward): TMA views of the
// problem's operands, per-device facts, and the dynamic shared-memory opt-in.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include <cute/tensor.hpp>

#include "common/problem.hpp"
#include "cuda/common/check.cuh"
#include "cuda/sm90/api.hpp"

namespace flashattn::cuda::sm90 {

// A TMA view of operand t, laid out over the problem's query rows (`query_side`) or key rows:
// (rows, head dim, heads, batch), the extents of operand_extent (api.hpp); the head dim's extent
// is the problem's where Traits::GmemShape has it dynamic (the forward), else the width. Strides of
// single-entry modes are never followed; they are replaced by a harmless aligned value since TMA
// requires every stride to be a multiple of 16 bytes. An operand with no elements may have no
// storage; TMA still wants a valid address (never read), so it gets Q's.
template <class Traits, class Element>
auto tma_view(const detail::Problem& p, const detail::SeqTensor& t, bool query_side) {
  using namespace cute;
  const OperandExtent e = operand_extent(p, query_side);
  Element* data = static_cast<Element*>(t.data ? t.data : p.q.data);
  const std::int64_t any = Traits::kHeadDim;
  auto pick = [&](std::int64_t stride, std::int64_t extent) { return extent > 1 ? stride : any; };
  const int rows_tma = int(std::max<std::int64_t>(e.rows, 1));
  auto dim = [&] {
    if constexpr (is_static<cute::remove_cvref_t<decltype(get<1>(typename Traits::GmemShape{}))>>::value)
      return Int<Traits::kHeadDim>{};
    else
      return int(p.head_dim);
  }();
  auto layout = make_layout(make_shape(rows_tma, dim, std::max(e.heads, 1), std::max(e.batch, 1)),
                            make_stride(pick(t.seq_stride, e.rows), _1{}, pick(t.head_stride, e.heads),
                                        pick(t.batch_stride, e.batch)));
  return make_tensor(make_gmem_ptr(data), layout);
}

// A TMA view of a paged K or V pool (num_pages, page_size, heads_kv, head dim), as (row in page,
// head dim, heads_kv, page): t's batch stride is the page stride (api/kv_cache.cpp: seq_of).
template <class Traits, class Element>
auto paged_kv_view(const detail::Problem& p, const detail::SeqTensor& t) {
  using namespace cute;
  const std::int64_t any = Traits::kHeadDim;
  const int pages = std::max(p.kv.pages.num_pages, 1), rows = std::max(p.kv.pages.page_size, 1);
  auto pick = [&](std::int64_t stride, std::int64_t extent) { return extent > 1 ? stride : any; };
  auto layout = make_layout(make_shape(rows, int(p.head_dim), std::max(p.heads_kv, 1), pages),
                            make_stride(pick(t.seq_stride, rows), _1{}, pick(t.head_stride, p.heads_kv),
                                        pick(t.batch_stride, pages)));
  return make_tensor(make_gmem_ptr(static_cast<Element*>(t.data ? t.data : p.q.data)), layout);
}

// Per-device facts, queried once (a call's host time counts for short problems).
struct DeviceFacts {
  int sm_count, l2_bytes;
};

inline DeviceFacts device_facts(int device) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> sms[kMaxDevices], l2s[kMaxDevices];
  if (device < 0 || device >= kMaxDevices || sms[device].load(std::memory_order_relaxed) == 0) {
    DeviceFacts f{};
    FA_CUDA_CHECK(cudaDeviceGetAttribute(&f.sm_count, cudaDevAttrMultiProcessorCount, device));
    FA_CUDA_CHECK(cudaDeviceGetAttribute(&f.l2_bytes, cudaDevAttrL2CacheSize, device));
    if (device < 0 || device >= kMaxDevices) return f;
    l2s[device].store(f.l2_bytes, std::memory_order_relaxed);
    sms[device].store(f.sm_count, std::memory_order_release);
  }
  return {sms[device].load(std::memory_order_acquire), l2s[device].load(std::memory_order_relaxed)};
}

// The SMs a persistent kernel of problem p spreads over: all but the caller's margin
// (AttentionOptions::sm_margin), at least one. Its tile order and wave planning count these.
inline int usable_sms(const detail::Problem& p, int sm_count) { return std::max(1, sm_count - p.sm_margin); }

// Raises a kernel's dynamic shared-memory limit, once per device.
template <auto kKernel>
void allow_shared_memory(int bytes, int device) {
  static std::atomic<unsigned long long> done{0};
  const unsigned long long bit = device >= 0 && device < 64 ? 1ull << device : 0;
  if (bit != 0 && (done.load(std::memory_order_acquire) & bit)) return;
  FA_CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  done.fetch_or(bit, std::memory_order_release);
}

}  // namespace flashattn::cuda::sm90
