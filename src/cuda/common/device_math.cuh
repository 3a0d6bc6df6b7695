#pragma once
// Small device math and memory helpers shared by the GPU kernels.
#include <cstdint>

#include <cute/arch/copy_sm80.hpp>
#include <cute/config.hpp>

namespace flashattn::cuda {

// tanh through exp, accurate to a few float ulps (tanh.approx is only ~2^-11 relative, too
// coarse for fp16 logits after soft-capping). Saturates cleanly to +-1.
CUTE_DEVICE float accurate_tanh(float x) {
  const float e = __expf(fminf(2.f * x, 80.f));  // e + 1 stays below 2^126 for __fdividef
  return 1.f - __fdividef(2.f, e + 1.f);
}

// 16-byte global -> shared copy through cp.async (L2 only); when `valid` is false nothing is
// read and the 16 bytes of shared memory are zero-filled.
CUTE_DEVICE void cp_async_16(void* smem, const void* gmem, bool valid) {
  cute::SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<cute::uint128_t>::copy(
      *static_cast<const cute::uint128_t*>(gmem), *static_cast<cute::uint128_t*>(smem), valid);
}

CUTE_DEVICE void cp_async_commit() { cute::cp_async_fence(); }

template <int kPending>
CUTE_DEVICE void cp_async_wait() {
  cute::cp_async_wait<kPending>();
}

}  // namespace flashattn::cuda
