#include "tests/support/gpu_test_support.h"

#include <cuda_runtime_api.h>

#include <spdlog/fmt/fmt.h>

namespace zrt::test {

namespace {
int g_gpu_index = 0;
}  // namespace

int gpu_index() {
  return g_gpu_index;
}
void set_gpu_index(int index) {
  g_gpu_index = index;
}

std::string no_gpu_reason() {
  int count = 0;
  const cudaError_t code = cudaGetDeviceCount(&count);
  if (code != cudaSuccess) {
    cudaGetLastError();
    return fmt::format("cudaGetDeviceCount: {}, error {}", cudaGetErrorString(code),
                       static_cast<int>(code));
  }
  if (count == 0) return "cudaGetDeviceCount found no device";
  return {};
}

}  // namespace zrt::test
