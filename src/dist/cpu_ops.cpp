// DeviceOps on the CPU: plain loops (the context-parallel CPU path is for tests and CI; the
// attention calls dominate its time).
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>

#include "common/numeric.hpp"
#include "dist/ops.hpp"
#include "flashattn/error.hpp"

namespace flashattn::dist::detail {
namespace {

float load(const TensorView& t, std::int64_t offset) {
  const char* p = static_cast<const char*>(t.data);
  switch (t.dtype) {
    case DType::f32: return reinterpret_cast<const float*>(p)[offset];
    case DType::f16: return flashattn::detail::half_to_float(reinterpret_cast<const std::uint16_t*>(p)[offset]);
    case DType::bf16: return flashattn::detail::bf16_to_float(reinterpret_cast<const std::uint16_t*>(p)[offset]);
    default: throw Error(ErrorKind::invalid_type, "tensor", "f32, f16 or bf16", to_string(t.dtype));
  }
}

void store(const TensorView& t, std::int64_t offset, float value) {
  char* p = static_cast<char*>(t.data);
  switch (t.dtype) {
    case DType::f32: reinterpret_cast<float*>(p)[offset] = value; return;
    case DType::f16: reinterpret_cast<std::uint16_t*>(p)[offset] = flashattn::detail::float_to_half(value); return;
    case DType::bf16: reinterpret_cast<std::uint16_t*>(p)[offset] = flashattn::detail::float_to_bf16(value); return;
    default: throw Error(ErrorKind::invalid_type, "tensor", "f32, f16 or bf16", to_string(t.dtype));
  }
}

// Calls f(offset_a, offset_b) for every index of `shape` (rank `rank`), with the offsets of that
// index in a and b.
template <class F>
void for_each(const TensorView& a, const TensorView& b, F&& f) {
  std::int64_t shape[4] = {1, 1, 1, 1}, sa[4] = {0, 0, 0, 0}, sb[4] = {0, 0, 0, 0};
  const int pad = 4 - a.rank;
  for (int i = 0; i < a.rank; ++i) {
    shape[pad + i] = a.shape[i];
    sa[pad + i] = a.stride[i];
    sb[pad + i] = b.stride[i];
  }
  for (std::int64_t i0 = 0; i0 < shape[0]; ++i0)
    for (std::int64_t i1 = 0; i1 < shape[1]; ++i1)
      for (std::int64_t i2 = 0; i2 < shape[2]; ++i2)
        for (std::int64_t i3 = 0; i3 < shape[3]; ++i3)
          f(i0 * sa[0] + i1 * sa[1] + i2 * sa[2] + i3 * sa[3], i0 * sb[0] + i1 * sb[1] + i2 * sb[2] + i3 * sb[3]);
}

class CpuOps final : public DeviceOps {
 public:
  void* allocate(std::size_t bytes, void*) const override {
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
    if (!p) throw Error(ErrorKind::runtime, "workspace", "an allocation to succeed", std::to_string(bytes) + " bytes");
    return p;
  }
  void release(void* data, void*) const override { std::free(data); }

  void copy(const TensorView& dst, const TensorView& src, void*) const override {
    for_each(dst, src, [&](std::int64_t d, std::int64_t s) { store(dst, d, load(src, s)); });
  }
  void add(const TensorView& dst, const TensorView& src, void*) const override {
    float* out = static_cast<float*>(dst.data);
    for_each(dst, src, [&](std::int64_t d, std::int64_t s) { out[d] += load(src, s); });
  }
  void fill(const TensorView& dst, float value, void*) const override {
    float* out = static_cast<float*>(dst.data);
    for_each(dst, dst, [&](std::int64_t d, std::int64_t) { out[d] = value; });
  }
  void merge(const TensorView& out_acc, const TensorView& lse_acc, const TensorView& out, const TensorView& lse,
             void*) const override {
    // Rows: the lse views' indices; the head dimension is the last of the outputs'.
    float* acc = static_cast<float*>(out_acc.data);
    float* lacc = static_cast<float*>(lse_acc.data);
    const float* lstep = static_cast<const float*>(lse.data);
    const std::int64_t d = out_acc.shape[out_acc.rank - 1];
    const std::int64_t sa_d = out_acc.stride[out_acc.rank - 1], so_d = out.stride[out.rank - 1];
    // Offsets of a row in out_acc and out: the same leading indices with their strides.
    // Walk rows of lse_acc/lse, and of the outputs, in lockstep.
    std::int64_t shape[3] = {1, 1, 1}, st[4][3] = {};
    const int pad = 3 - lse_acc.rank;
    for (int i = 0; i < lse_acc.rank; ++i) {
      shape[pad + i] = lse_acc.shape[i];
      st[0][pad + i] = lse_acc.stride[i];
      st[1][pad + i] = lse.stride[i];
      st[2][pad + i] = out_acc.stride[i];
      st[3][pad + i] = out.stride[i];
    }
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    for (std::int64_t i0 = 0; i0 < shape[0]; ++i0)
      for (std::int64_t i1 = 0; i1 < shape[1]; ++i1)
        for (std::int64_t i2 = 0; i2 < shape[2]; ++i2) {
          auto off = [&](int k) { return i0 * st[k][0] + i1 * st[k][1] + i2 * st[k][2]; };
          const float la = lacc[off(0)], ls = lstep[off(1)];
          const float m = std::fmax(la, ls);
          if (m == kNegInf) continue;
          const float wa = std::exp(la - m), ws = std::exp(ls - m);
          const float total = wa + ws;
          const float ca = wa / total, cs = ws / total;
          const std::int64_t oa = off(2), os = off(3);
          for (std::int64_t j = 0; j < d; ++j)
            acc[oa + j * sa_d] = acc[oa + j * sa_d] * ca + load(out, os + j * so_d) * cs;
          lacc[off(0)] = m + std::log(total);
        }
  }
  void divide_offsets(std::int32_t* dst, const std::int32_t* src, int count, int divisor, void*) const override {
    for (int i = 0; i < count; ++i) dst[i] = src[i] / divisor;
  }
};

}  // namespace

const DeviceOps& cpu_ops() {
  static const CpuOps ops;
  return ops;
}

#ifndef FLASHATTN_WITH_CUDA
const DeviceOps& cuda_ops() {
  throw Error(ErrorKind::unsupported, "q", "a build with the CUDA backend", "a CPU-only build");
}
#endif

}  // namespace flashattn::dist::detail
