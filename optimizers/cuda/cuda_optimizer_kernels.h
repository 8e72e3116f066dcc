// The fused multi-tensor optimizer kernel's launcher and its slice table entry, kept free of
// host-only headers so cuda_optimizer_kernels.cu needs nothing but adam_math.h and lion_math.h.
// Used by CudaAdam and CudaLion through CudaSliceTable (cuda_slice_table.h) only.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "optimizers/adam_math.h"
#include "optimizers/lion_math.h"
#include "runtime/engine/step_decision.h"

namespace zrt::detail {

// Elements one thread block updates (256 threads x 8).
constexpr std::int64_t kCudaOptimizerBlockElems = 2048;

// The most state arrays an optimizer keeps (Adam's two; kMaxOptimizerStates on the host).
constexpr int kCudaOptimizerMaxStates = 2;

// One slice in the device-side table. Zero-initialise before filling: tables are compared
// bytewise.
struct CudaOptimizerDesc {
  float* param;
  const void* grad;
  float* state[kCudaOptimizerMaxStates];  // the optimizer's states in spec order; unused: null
  void* param_out;
  std::int64_t numel;
  std::int64_t first_block;  // index of the slice's first thread block in the grid
  std::uint8_t grad_kind;    // 0 fp32, 1 bf16, 2 fp16
  std::uint8_t out_kind;     // 0 none, 1 fp32, 2 bf16, 3 fp16
  std::uint8_t weight_decay;
  std::uint8_t pad[5];
};

// Enqueues optimizer Math's kernel on `stream`: `blocks` thread blocks over the `count` slices
// of the device-resident `table`. `decision` (device memory, or null): every block reads it
// first; it returns at once when the step does not apply, else uses its grad_scale instead of
// s.grad_scale. The caller checks cudaGetLastError(). Defined for AdamMath and LionMath.
template <typename Math>
void launch_cuda_optimizer(const CudaOptimizerDesc* table, int count, int blocks,
                           const typename Math::Scalars& s, const StepDecision* decision,
                           cudaStream_t stream);

}  // namespace zrt::detail
