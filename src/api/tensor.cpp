#include "flashattn/tensor.hpp"

#include <string>

#include "flashattn/error.hpp"

namespace flashattn {

const char* to_string(DType dtype) noexcept {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::e4m3: return "e4m3";
    case DType::e5m2: return "e5m2";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
  }
  return "unknown";
}

const char* to_string(DeviceKind device) noexcept {
  return device == DeviceKind::cpu ? "cpu" : "cuda";
}

std::size_t element_size(DType dtype) noexcept {
  switch (dtype) {
    case DType::f32: case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::f16: case DType::bf16: return 2;
    case DType::e4m3: case DType::e5m2: return 1;
  }
  return 0;
}

std::int64_t TensorView::numel() const noexcept {
  if (rank <= 0) return 0;
  std::int64_t n = 1;
  for (int i = 0; i < rank; ++i) n *= shape[i];
  return n;
}

static void fill_shape(TensorView& t, std::initializer_list<std::int64_t> shape) {
  if (shape.size() < 1 || shape.size() > std::size_t(TensorView::kMaxRank))
    throw Error(ErrorKind::invalid_argument, "shape", "1 to 4 dimensions",
                std::to_string(shape.size()));
  t.rank = int(shape.size());
  int i = 0;
  for (auto s : shape) t.shape[i++] = s;
}

TensorView TensorView::contiguous(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                                  DeviceKind device, int device_index) {
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.device_index = device_index;
  fill_shape(t, shape);
  std::int64_t stride = 1;
  for (int i = t.rank - 1; i >= 0; --i) {
    t.stride[i] = stride;
    stride *= t.shape[i] > 0 ? t.shape[i] : 1;
  }
  return t;
}

TensorView TensorView::strided(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                               std::initializer_list<std::int64_t> stride, DeviceKind device,
                               int device_index) {
  TensorView t = contiguous(data, dtype, shape, device, device_index);
  if (stride.size() != shape.size())
    throw Error(ErrorKind::invalid_argument, "stride", std::to_string(shape.size()) + " strides",
                std::to_string(stride.size()));
  int i = 0;
  for (auto s : stride) t.stride[i++] = s;
  return t;
}

}  // namespace flashattn
