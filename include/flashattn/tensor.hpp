#pragma once
// Tensor views: a pointer, a dtype, a device, a shape and strides (in elements). The library
// never owns or allocates the memory a view points to.
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>

namespace flashattn {

enum class DType : std::uint8_t { f32, f16, bf16, e4m3, e5m2, i32, i64 };
enum class DeviceKind : std::uint8_t { cpu, cuda };

const char* to_string(DType dtype) noexcept;
const char* to_string(DeviceKind device) noexcept;
std::size_t element_size(DType dtype) noexcept;

struct TensorView {
  static constexpr int kMaxRank = 4;

  void* data = nullptr;
  DType dtype = DType::f32;
  DeviceKind device = DeviceKind::cpu;
  int device_index = 0;
  int rank = 0;  // 0: the tensor is absent (optional arguments)
  std::array<std::int64_t, kMaxRank> shape{};
  std::array<std::int64_t, kMaxRank> stride{};

  bool present() const noexcept { return rank > 0; }
  std::int64_t numel() const noexcept;

  // A row-major (contiguous) view.
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                               DeviceKind device = DeviceKind::cpu, int device_index = 0);
  // A view with explicit strides (in elements).
  static TensorView strided(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                            std::initializer_list<std::int64_t> stride,
                            DeviceKind device = DeviceKind::cpu, int device_index = 0);
};

}  // namespace flashattn
