#include "runtime/device/device.h"

#include <cstdlib>
#include <string>

#include "runtime/common/error.h"
#include "runtime/device/cpu_device.h"
#include "runtime/device/cpu_stream.h"
#if ZRT_HAVE_CUDA
#include "runtime/device/cuda_device.h"
#endif

namespace zrt {

std::unique_ptr<CpuStream> Device::create_host_stream(const std::string& name) {
  return std::make_unique<CpuStream>(name, 0, 0);
}

const char* device_type_name(DeviceType t) {
  return t == DeviceType::kCpu ? "cpu" : "cuda";
}

bool poison_allocations_from_env() {
  const char* env = std::getenv("ZRT_POISON_ALLOCATIONS");
  return env != nullptr && *env != '\0' && std::string(env) != "0";
}

std::unique_ptr<Device> make_device(const DeviceOptions& options) {
  DeviceOptions chosen = options;
  // ZRT_STREAM_DELAY_US turns on race detection for any program without a rebuild.
  if (chosen.stream_delay_max_us == 0) {
    if (const char* env = std::getenv("ZRT_STREAM_DELAY_US")) {
      chosen.stream_delay_max_us = std::stoi(env);
    }
  }
  // ZRT_POISON_ALLOCATIONS=1 the same for reads of memory never written.
  if (poison_allocations_from_env()) chosen.poison_allocations = true;
  if (chosen.type == DeviceType::kCpu) return std::make_unique<CpuDevice>(chosen);
#if ZRT_HAVE_CUDA
  return make_cuda_device(chosen);
#else
  ZRT_THROW(InvalidArgument,
            "device type 'cuda' requested but this zrt was built without CUDA (ZRT_CUDA=OFF or "
            "no nvcc at configure time)");
#endif
}

#if !ZRT_HAVE_CUDA
int cuda_device_count() {
  return 0;
}
#endif

const void* Device::host_address(DevicePtr<const std::byte> /*p*/) const {
  return nullptr;
}

}  // namespace zrt
