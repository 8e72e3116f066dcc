// CudaAdam: Adam/AdamW over device-memory slices as one fused multi-tensor kernel launch per
// step, with the same element update as the CPU optimizer (adam.h): explicit round-to-nearest
// intrinsics, no FMA, IEEE division and square root, so its results equal CpuAdam's bit for bit.
// Built only when ZRT_HAVE_CUDA.
//
// The slice table lives in device memory and is re-uploaded only when the slices change
// (cuda_slice_table.h), so a training loop that passes the same slices every step costs exactly
// one kernel launch per step.
//
// Thread-safety: one thread at a time; calls on different streams must be ordered by the caller
// (they share the device-side slice table).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "optimizers/adam.h"
#include "optimizers/cuda/cuda_slice_table.h"
#include "optimizers/optimizer_config.h"

namespace zrt {

class CudaAdam {
 public:
  explicit CudaAdam(const AdamOptions& options) : options_(options) {}

  // Enqueues Adam step `step` (1-based) with learning rate `lr` on every slice, on `stream`,
  // gradients multiplied by `grad_scale` (see CpuAdam::step), or as the device-resident
  // `decision` says when it is given (DeviceOptimizer::step). Returns at once; the slices'
  // memory must stay valid until the stream reaches this point. Throws InvalidArgument for a
  // malformed slice, step < 1 or a bad grad_scale before enqueuing anything.
  void step(const AdamDeviceSlice* slices, std::size_t count, std::int64_t step, double lr,
            cudaStream_t stream, double grad_scale = 1.0, const StepDecision* decision = nullptr);
  void step(const std::vector<AdamDeviceSlice>& slices, std::int64_t step, double lr,
            cudaStream_t stream, double grad_scale = 1.0, const StepDecision* decision = nullptr) {
    this->step(slices.data(), slices.size(), step, lr, stream, grad_scale, decision);
  }

  const AdamOptions& options() const { return options_; }

 private:
  AdamOptions options_;
  detail::CudaSliceTable table_;
};

}  // namespace zrt
