// Prints the compute capabilities of the CUDA devices this process can see as a CMake list
// (major * 10 + minor, e.g. "86;90"), and nothing where there is no driver or no device.
// cmake/flashattnCudaTargets.cmake builds and runs it at configure time. It loads the driver
// library itself (dlopen), so it builds with the host compiler alone, needs neither CUDA headers
// nor the toolkit's runtime, and sees the devices CUDA_VISIBLE_DEVICES leaves visible.
#include <dlfcn.h>

#include <cstdio>

namespace {
// The driver API's stable C ABI: CUresult is an int, CUdevice an int.
using InitFn = int (*)(unsigned int);
using CountFn = int (*)(int*);
using GetFn = int (*)(int*, int);
using AttributeFn = int (*)(int*, int, int);
constexpr int kComputeCapabilityMajor = 75;  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
constexpr int kComputeCapabilityMinor = 76;  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
}  // namespace

int main() {
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!driver) return 0;
  auto init = reinterpret_cast<InitFn>(dlsym(driver, "cuInit"));
  auto count = reinterpret_cast<CountFn>(dlsym(driver, "cuDeviceGetCount"));
  auto get = reinterpret_cast<GetFn>(dlsym(driver, "cuDeviceGet"));
  auto attribute = reinterpret_cast<AttributeFn>(dlsym(driver, "cuDeviceGetAttribute"));
  if (!init || !count || !get || !attribute || init(0) != 0) return 0;
  int devices = 0;
  if (count(&devices) != 0) return 0;
  const char* separator = "";
  for (int i = 0; i < devices; ++i) {
    int device = 0, major = 0, minor = 0;
    if (get(&device, i) != 0 || attribute(&major, kComputeCapabilityMajor, device) != 0 ||
        attribute(&minor, kComputeCapabilityMinor, device) != 0)
      continue;
    std::printf("%s%d", separator, major * 10 + minor);
    separator = ";";
  }
  return 0;
}
