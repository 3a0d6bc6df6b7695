#include "device_buffer.hpp"

#include <stdexcept>
#include <string>
#include <utility>

#ifdef FLASHATTN_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace flashattn::host {

#ifdef FLASHATTN_WITH_CUDA
static void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
  check(cudaMalloc(&data_, bytes ? bytes : 16), "cudaMalloc");
}
DeviceBuffer::~DeviceBuffer() {
  if (data_) cudaFree(data_);
}
DeviceBuffer DeviceBuffer::upload(const HostTensor& t) {
  DeviceBuffer b(t.storage_bytes());
  check(cudaMemcpy(b.data_, t.data(), t.storage_bytes(), cudaMemcpyHostToDevice), "upload");
  return b;
}
void DeviceBuffer::download(HostTensor& t) const {
  check(cudaMemcpy(t.data(), data_, t.storage_bytes(), cudaMemcpyDeviceToHost), "download");
}
void device_synchronize() { check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }
#else
DeviceBuffer::DeviceBuffer(std::size_t) { throw std::runtime_error("built without CUDA"); }
DeviceBuffer::~DeviceBuffer() = default;
DeviceBuffer DeviceBuffer::upload(const HostTensor&) { throw std::runtime_error("built without CUDA"); }
void DeviceBuffer::download(HostTensor&) const { throw std::runtime_error("built without CUDA"); }
void device_synchronize() {}
#endif

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  std::swap(data_, other.data_);
  std::swap(bytes_, other.bytes_);
  return *this;
}

}  // namespace flashattn::host
