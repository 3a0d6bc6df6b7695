#pragma once
// A device copy of a HostTensor's storage (same bytes, same strides), for CUDA runs. Only
// available when the library is built with CUDA; without it, constructing one throws.
#include <cstddef>

#include "host_tensor.hpp"

namespace flashattn::host {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }

  static DeviceBuffer upload(const HostTensor& t);  // copies the whole storage
  void download(HostTensor& t) const;               // back into the whole storage

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

void device_synchronize();

}  // namespace flashattn::host
