// The CUDA backend's device: cudaMallocAsync from the device's memory pool for device memory,
// cudaHostAlloc for pinned host memory, cudaStream_t / cudaEvent_t for streams and events.
// Built only when ZRT_HAVE_CUDA.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>

#include "runtime/device/device.h"

namespace zrt {

// Checks a CUDA runtime return code; throws zrt::Error with cudaGetErrorString and file:line.
void check_cuda(cudaError_t code, const char* call, const char* file, int line);

// Selects options.index (cudaSetDevice) and creates the device. Throws if no GPU is usable.
std::unique_ptr<Device> make_cuda_device(const DeviceOptions& options);

// The cudaStream_t behind a CUDA backend stream; throws if `stream` belongs to another backend.
cudaStream_t cuda_stream_handle(Stream& stream);

}  // namespace zrt

#define ZRT_CUDA_CHECK(call) ::zrt::check_cuda((call), #call, __FILE__, __LINE__)
