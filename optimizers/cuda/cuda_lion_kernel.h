// The fused Lion kernel's launcher and slice table entry, kept free of host-only headers so
// cuda_lion.cu needs nothing but lion_math.h. Used by CudaLion (cuda_lion.cc) only.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "optimizers/lion_math.h"

namespace zrt::detail {

// Elements one thread block updates (256 threads x 8), as the Adam kernel.
constexpr std::int64_t kCudaLionBlockElems = 2048;

// One slice in the device-side table. Zero-initialise before filling: tables are compared
// bytewise.
struct CudaLionDesc {
  float* param;
  const void* grad;
  float* exp_avg;
  void* param_out;
  std::int64_t numel;
  std::int64_t first_block;  // index of the slice's first thread block in the grid
  std::uint8_t grad_kind;    // 0 fp32, 1 bf16, 2 fp16
  std::uint8_t out_kind;     // 0 none, 1 fp32, 2 bf16, 3 fp16
  std::uint8_t weight_decay;
  std::uint8_t pad[5];
};

// Enqueues the kernel on `stream`: `blocks` thread blocks over the `count` slices of the
// device-resident `table`. The caller checks cudaGetLastError().
void launch_cuda_lion(const CudaLionDesc* table, int count, int blocks, const LionStepScalars& s,
                      cudaStream_t stream);

}  // namespace zrt::detail
