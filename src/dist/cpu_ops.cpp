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

// Calls f(offsets) for every index of views[0]'s shape, with that index's offset in each view.
template <std::size_t N, class F>
void for_each(const TensorView (&views)[N], F&& f) {
  std::int64_t shape[4] = {1, 1, 1, 1}, st[N][4] = {};
  const int pad = 4 - views[0].rank;
  for (int i = 0; i < views[0].rank; ++i) {
    shape[pad + i] = views[0].shape[i];
    for (std::size_t v = 0; v < N; ++v) st[v][pad + i] = views[v].stride[i];
  }
  std::int64_t off[N];
  for (std::int64_t i0 = 0; i0 < shape[0]; ++i0)
    for (std::int64_t i1 = 0; i1 < shape[1]; ++i1)
      for (std::int64_t i2 = 0; i2 < shape[2]; ++i2)
        for (std::int64_t i3 = 0; i3 < shape[3]; ++i3) {
          for (std::size_t v = 0; v < N; ++v) off[v] = i0 * st[v][0] + i1 * st[v][1] + i2 * st[v][2] + i3 * st[v][3];
          f(off);
        }
}

class CpuOps final : public DeviceOps {
 public:
  void* allocate(std::size_t bytes, void*) const override {
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
    if (!p) throw Error(ErrorKind::runtime, "workspace", "an allocation to succeed", std::to_string(bytes) + " bytes");
    return p;
  }
  void release(void* data, void*) const override { std::free(data); }

  void copy_bytes(void* dst, const void* src, std::size_t bytes, void*) const override { std::memcpy(dst, src, bytes); }
  void copy(const TensorView& dst, const TensorView& src, void*) const override {
    for_each<2>({dst, src}, [&](const std::int64_t* o) { store(dst, o[0], load(src, o[1])); });
  }
  void add(const TensorView& dst, const TensorView& a, const TensorView& b, void*) const override {
    for_each<3>({dst, a, b}, [&](const std::int64_t* o) { store(dst, o[0], load(a, o[1]) + load(b, o[2])); });
  }
  void fill(const TensorView& dst, float value, void*) const override {
    for_each<1>({dst}, [&](const std::int64_t* o) { store(dst, o[0], value); });
  }
  void merge(const TensorView& dst_out, const TensorView& dst_lse, const TensorView& out_acc, const TensorView& lse_acc,
             const TensorView& out, const TensorView& lse, void*) const override {
    // Rows: the lse views' indices (padded to rank 3); the head dimension is the outputs' last.
    const std::int64_t d = out_acc.shape[out_acc.rank - 1];
    const TensorView* outs[3] = {&out_acc, &out, &dst_out};
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    // Row offsets in the outputs: the lse views' leading indices with the outputs' strides.
    TensorView rows[3];
    for (int k = 0; k < 3; ++k) {
      rows[k] = *outs[k];
      rows[k].rank = outs[k]->rank - 1;
    }
    for_each<6>({lse_acc, lse, dst_lse, rows[0], rows[1], rows[2]}, [&](const std::int64_t* o) {
      const float la = load(lse_acc, o[0]), ls = load(lse, o[1]);
      const float m = std::fmax(la, ls);
      if (m == kNegInf) {
        for (std::int64_t j = 0; j < d; ++j) store(dst_out, o[5] + j * dst_out.stride[dst_out.rank - 1], 0.0f);
        store(dst_lse, o[2], kNegInf);
        return;
      }
      const float wa = std::exp(la - m), ws = std::exp(ls - m);
      const float total = wa + ws;
      const float ca = wa / total, cs = ws / total;
      for (std::int64_t j = 0; j < d; ++j)
        store(dst_out, o[5] + j * dst_out.stride[dst_out.rank - 1],
              load(out_acc, o[3] + j * out_acc.stride[out_acc.rank - 1]) * ca + load(out, o[4] + j * out.stride[out.rank - 1]) * cs);
      store(dst_lse, o[2], m + std::log(total));
    });
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
