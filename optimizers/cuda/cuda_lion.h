// CudaLion: Lion over device-memory slices as one fused multi-tensor kernel launch per step,
// with the same element update as CpuLion (lion.h): explicit round-to-nearest intrinsics, no
// FMA, so its results equal CpuLion's bit for bit. The slice table lives in device memory and is
// re-uploaded (stream-ordered) only when the slices change (cuda_slice_table.h). Built only when
// ZRT_HAVE_CUDA.
//
// Thread-safety: one thread at a time; calls on different streams must be ordered by the caller.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "optimizers/cuda/cuda_slice_table.h"
#include "optimizers/lion.h"
#include "optimizers/optimizer_config.h"

namespace zrt {

class CudaLion {
 public:
  explicit CudaLion(const LionOptions& options) : options_(options) {}

  // Enqueues one Lion step with learning rate `lr` on every slice, on `stream` (with a
  // device-resident `decision`, as DeviceOptimizer::step says). Throws InvalidArgument for a
  // malformed slice or bad scalars before enqueuing anything.
  void step(const std::vector<LionDeviceSlice>& slices, double lr, cudaStream_t stream,
            double grad_scale = 1.0, const StepDecision* decision = nullptr);

  const LionOptions& options() const { return options_; }

 private:
  LionOptions options_;
  detail::CudaSliceTable table_;
};

}  // namespace zrt
