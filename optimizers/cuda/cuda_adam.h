// CudaAdam: Adam/AdamW over device-memory slices as one fused multi-tensor kernel launch per
// step, with the same element update as the CPU optimizer (adam.h): explicit round-to-nearest
// intrinsics, no FMA, IEEE division and square root, so its results equal CpuAdam's bit for bit.
// Built only when ZRT_HAVE_CUDA.
//
// The slice table (pointers, sizes, dtypes; a few dozen bytes per slice) lives in device memory
// and is uploaded, stream-ordered, only when the slices differ from the previous call's; the
// per-step scalars travel as kernel arguments. So a training loop that passes the same slices
// every step costs exactly one kernel launch per step.
//
// Thread-safety: one thread at a time; calls on different streams must be ordered by the caller
// (they share the device-side slice table).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "optimizers/adam.h"
#include "optimizers/cuda/cuda_adam_kernel.h"
#include "optimizers/optimizer_config.h"

namespace zrt {

class CudaAdam {
 public:
  explicit CudaAdam(const AdamOptions& options);
  ~CudaAdam();
  CudaAdam(const CudaAdam&) = delete;
  CudaAdam& operator=(const CudaAdam&) = delete;

  // Enqueues Adam step `step` (1-based) with learning rate `lr` on every slice, on `stream`,
  // gradients multiplied by `grad_scale` (see CpuAdam::step). Returns at once; the slices'
  // memory must stay valid until the stream reaches this point. Throws InvalidArgument for a
  // malformed slice, step < 1 or a bad grad_scale before enqueuing anything.
  void step(const AdamDeviceSlice* slices, std::size_t count, std::int64_t step, double lr,
            cudaStream_t stream, double grad_scale = 1.0);
  void step(const std::vector<AdamDeviceSlice>& slices, std::int64_t step, double lr,
            cudaStream_t stream, double grad_scale = 1.0) {
    this->step(slices.data(), slices.size(), step, lr, stream, grad_scale);
  }

  const AdamOptions& options() const { return options_; }

 private:
  AdamOptions options_;
  std::vector<detail::CudaAdamDesc> table_;  // last uploaded table (host copy)
  detail::CudaAdamDesc* device_table_ = nullptr;
  std::size_t device_capacity_ = 0;  // entries
  std::int64_t blocks_ = 0;          // grid size of the uploaded table
};

}  // namespace zrt
