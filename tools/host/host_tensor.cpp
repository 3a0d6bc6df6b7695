#include "host_tensor.hpp"

#include <cmath>
#include <cstring>
#include <stdexcept>

#include "common/numeric.hpp"

namespace flashattn::host {

namespace {
std::vector<std::int64_t> row_major_strides(const std::vector<std::int64_t>& shape) {
  std::vector<std::int64_t> stride(shape.size());
  std::int64_t s = 1;
  for (int i = int(shape.size()) - 1; i >= 0; --i) {
    stride[i] = s;
    s *= shape[i] > 0 ? shape[i] : 1;
  }
  return stride;
}
std::int64_t product(const std::vector<std::int64_t>& v) {
  std::int64_t n = 1;
  for (auto x : v) n *= x;
  return n;
}
}  // namespace

HostTensor::HostTensor(DType dtype, std::vector<std::int64_t> shape)
    : HostTensor(dtype, shape, row_major_strides(shape), product(shape)) {}

HostTensor::HostTensor(DType dtype, std::vector<std::int64_t> shape, std::vector<std::int64_t> stride,
                       std::int64_t storage_elements)
    : dtype_(dtype), shape_(std::move(shape)), stride_(std::move(stride)),
      bytes_(std::size_t(storage_elements) * element_size(dtype)) {
  if (shape_.size() != stride_.size() || shape_.empty() || shape_.size() > 4)
    throw std::invalid_argument("HostTensor: shape and stride must have 1 to 4 equal dimensions");
  // Storage must hold the last element (16 extra bytes keep zero-size tensors non-null).
  std::int64_t last = 0;
  for (std::size_t i = 0; i < shape_.size(); ++i)
    if (shape_[i] > 0) last += (shape_[i] - 1) * stride_[i];
  if (numel() > 0 && last >= storage_elements)
    throw std::invalid_argument("HostTensor: storage too small for its strides");
  bytes_.resize(bytes_.size() + 16);
}

std::int64_t HostTensor::numel() const { return product(shape_); }

TensorView HostTensor::view(DeviceKind device, void* data, int device_index) {
  TensorView t;
  t.data = data ? data : bytes_.data();
  t.dtype = dtype_;
  t.device = device;
  t.device_index = device_index;
  t.rank = int(shape_.size());
  for (int i = 0; i < t.rank; ++i) {
    t.shape[i] = shape_[i];
    t.stride[i] = stride_[i];
  }
  return t;
}

std::int64_t HostTensor::offset_of(std::int64_t logical) const {
  std::int64_t offset = 0;
  for (int i = int(shape_.size()) - 1; i >= 0; --i) {
    offset += (logical % shape_[i]) * stride_[i];
    logical /= shape_[i];
  }
  return offset;
}

float HostTensor::get(std::int64_t i) const {
  const std::int64_t o = offset_of(i);
  const unsigned char* p = bytes_.data() + o * element_size(dtype_);
  std::uint16_t h;
  switch (dtype_) {
    case DType::f16: std::memcpy(&h, p, 2); return detail::half_to_float(h);
    case DType::bf16: std::memcpy(&h, p, 2); return detail::bf16_to_float(h);
    case DType::e4m3: return detail::e4m3_to_float(*p);
    case DType::i32: { std::int32_t v; std::memcpy(&v, p, 4); return float(v); }
    case DType::i64: { std::int64_t v; std::memcpy(&v, p, 8); return float(v); }
    default: { float f; std::memcpy(&f, p, 4); return f; }
  }
}

void HostTensor::set(std::int64_t i, float value) {
  const std::int64_t o = offset_of(i);
  unsigned char* p = bytes_.data() + o * element_size(dtype_);
  std::uint16_t h;
  switch (dtype_) {
    case DType::f16: h = detail::float_to_half(value); std::memcpy(p, &h, 2); break;
    case DType::bf16: h = detail::float_to_bf16(value); std::memcpy(p, &h, 2); break;
    case DType::e4m3: *p = detail::float_to_e4m3(value); break;
    case DType::i32: { std::int32_t v = std::int32_t(value); std::memcpy(p, &v, 4); break; }
    case DType::i64: { std::int64_t v = std::int64_t(value); std::memcpy(p, &v, 8); break; }
    default: std::memcpy(p, &value, 4); break;
  }
}

void HostTensor::fill_normal(std::mt19937_64& rng, float stddev) {
  std::normal_distribution<float> normal(0.0f, stddev);
  const std::int64_t n = numel();
  for (std::int64_t i = 0; i < n; ++i) set(i, normal(rng));
}

void HostTensor::fill_normal_parallel(std::uint64_t seed, float stddev) {
  auto splitmix64 = [](std::uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  };
  const std::int64_t n = numel();
  const std::uint64_t key = splitmix64(seed);
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < n; ++i) {
    // Box-Muller on two 32-bit uniforms of one 64-bit hash; u1 in (0, 1] keeps log finite.
    const std::uint64_t bits = splitmix64(key ^ std::uint64_t(i));
    const float u1 = (float(bits >> 40) + 1.0f) * 0x1p-24f, u2 = float(bits & 0xffffff) * 0x1p-24f;
    set(i, stddev * std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853f * u2));
  }
}

void HostTensor::poison() { std::memset(bytes_.data(), 0xff, bytes_.size()); }

std::vector<float> HostTensor::to_floats() const {
  std::vector<float> out(static_cast<std::size_t>(numel()));
  for (std::int64_t i = 0; i < numel(); ++i) out[std::size_t(i)] = get(i);
  return out;
}

HostTensor HostTensor::to_f32() const {
  HostTensor t(DType::f32, shape_);
  for (std::int64_t i = 0; i < numel(); ++i) t.set(i, get(i));
  return t;
}

bool HostTensor::padding_untouched() const {
  std::vector<bool> logical(bytes_.size(), false);
  const std::size_t es = element_size(dtype_);
  for (std::int64_t i = 0; i < numel(); ++i)
    for (std::size_t b = 0; b < es; ++b) logical[std::size_t(offset_of(i)) * es + b] = true;
  for (std::size_t b = 0; b < bytes_.size(); ++b)
    if (!logical[b] && bytes_[b] != 0xff) return false;
  return true;
}

double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (!std::isfinite(b[i])) continue;
    if (std::isnan(a[i])) return std::nan("");
    const double d = double(a[i]) - b[i];
    num += d * d;
    den += double(b[i]) * b[i];
  }
  if (a.size() != b.size()) return std::nan("");
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

}  // namespace flashattn::host
