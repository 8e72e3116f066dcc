#include "optimizers/cuda/cuda_adam.h"

namespace zrt {

void CudaAdam::step(const AdamDeviceSlice* slices, std::size_t count, std::int64_t step, double lr,
                    cudaStream_t stream, double grad_scale, const StepDecision* decision) {
  table_.launch<AdamMath>(slices, count, adam_step_scalars(options_, step, lr, grad_scale),
                          decision, stream);
}

}  // namespace zrt
