// How zrt picks a CPU twin or a CUDA kernel (and the helpers for it). Header-only: the CUDA
// stand-ins link the dispatching files without the rest of the device library.
#pragma once

#include "runtime/common/error.h"
#include "runtime/device/device.h"

namespace zrt {

// CPU twins and CUDA kernels: the one way zrt picks between them. Test runs_on_cpu() first and
// return from the CPU branch; the CUDA branch follows, compiled only where the CUDA backend is,
// and a build without it says which operation needed it:
//
//   if (runs_on_cpu(device)) {
//     ...enqueue the CPU twin on the stream...;
//     return;
//   }
// #if ZRT_HAVE_CUDA
//   cuda::scale(stream, ...);
// #else
//   cuda_backend_missing("engine_kernels::scale");
// #endif
//
// CPU first because the CPU backend exists in every build; one test, so a third backend would
// have one place per operation to go. Objects whose whole implementation differs per backend
// (process groups, DeviceAdam, KernelContext's handles) choose it the same way, once, where they
// are made.
inline bool runs_on_cpu(const Device& device) {
  return device.type() == DeviceType::kCpu;
}
// Throws InvalidArgument: `what` needs the CUDA backend, which this build lacks.
[[noreturn]] inline void cuda_backend_missing(const char* what) {
  ZRT_THROW(InvalidArgument,
            "{}: the CUDA backend is not built (ZRT_CUDA=OFF or no nvcc at configure time)", what);
}

}  // namespace zrt
