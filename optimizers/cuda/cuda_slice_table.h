// The launch of the fused multi-tensor optimizer kernel (cuda_optimizer_kernels.h), shared by
// CudaAdam and CudaLion, and its slice table: one entry per non-empty slice (pointers, sizes,
// dtypes; a few dozen bytes each) in device memory, uploaded, stream-ordered, only when the slices
// differ from the previous call's; the per-step scalars travel as kernel arguments. So a training
// loop that passes the same slices every step costs exactly one kernel launch per step. Built only
// when ZRT_HAVE_CUDA.
//
// Thread-safety: one thread at a time; calls on different streams must be ordered by the caller
// (they share the device-side table).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "optimizers/cuda/cuda_optimizer_kernels.h"
#include "optimizers/optimizer_slices.h"

namespace zrt::detail {

class CudaSliceTable {
 public:
  CudaSliceTable() = default;
  ~CudaSliceTable();
  CudaSliceTable(const CudaSliceTable&) = delete;
  CudaSliceTable& operator=(const CudaSliceTable&) = delete;

  // One step of optimizer Math (AdamMath, LionMath) over `slices` with `scalars`: update(),
  // then one kernel launch on `stream` (none if no slice has elements). With a device-resident
  // `decision` the kernel takes grad_scale from it and writes nothing when it does not apply.
  // Throws InvalidArgument for a malformed slice before enqueuing anything.
  template <typename Math, typename DeviceSlice>
  void launch(const DeviceSlice* slices, std::size_t count, const typename Math::Scalars& scalars,
              const StepDecision* decision, cudaStream_t stream) {
    if (!update(slices, count, stream)) return;
    launch_cuda_optimizer<Math>(device_table(), this->count(), blocks(), scalars, decision, stream);
    check_launch();
  }

  // Validates every slice (throws InvalidArgument before enqueuing anything), then makes the
  // device table hold the non-empty ones, uploading it on `stream` if it changed. Returns false
  // if no slice has elements (nothing to launch).
  template <typename DeviceSlice>
  bool update(const DeviceSlice* slices, std::size_t count, cudaStream_t stream) {
    static_assert(kNumSliceStates<DeviceSlice> <= kCudaOptimizerMaxStates, "too many states");
    std::vector<CudaOptimizerDesc> table;
    table.reserve(count);
    for (std::size_t k = 0; k < count; ++k) {
      const DeviceSlice& s = slices[k];
      validate_slice(s, k);
      if (s.numel == 0) continue;
      const auto states = raw_states(s);
      table.push_back(describe(raw_pointer(s.param), raw_pointer(s.grad), states.data(),
                               states.size(), raw_pointer(s.param_out), s.numel, s.grad_dtype,
                               s.out_dtype, s.weight_decay));
    }
    return upload(std::move(table), stream);
  }

  // The table of the last update(), in device memory, its entries and its grid size.
  const CudaOptimizerDesc* device_table() const { return device_table_; }
  int count() const { return static_cast<int>(table_.size()); }
  int blocks() const { return static_cast<int>(blocks_); }

 private:
  static CudaOptimizerDesc describe(float* param, const void* grad, float* const* states,
                                    std::size_t num_states, void* param_out, std::int64_t numel,
                                    DType grad_dtype, DType out_dtype, bool weight_decay);
  bool upload(std::vector<CudaOptimizerDesc> table, cudaStream_t stream);
  static void check_launch();  // ZRT_CUDA_CHECK(cudaGetLastError())

  std::vector<CudaOptimizerDesc> table_;  // last uploaded table (host copy)
  CudaOptimizerDesc* device_table_ = nullptr;
  std::size_t device_capacity_ = 0;  // entries
  std::int64_t blocks_ = 0;          // grid size of the uploaded table
};

}  // namespace zrt::detail
