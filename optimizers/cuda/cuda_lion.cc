#include "optimizers/cuda/cuda_lion.h"

namespace zrt {

void CudaLion::step(const std::vector<LionDeviceSlice>& slices, double lr, cudaStream_t stream,
                    double grad_scale, const StepDecision* decision) {
  table_.launch<LionMath>(slices.data(), slices.size(), lion_step_scalars(options_, lr, grad_scale),
                          decision, stream);
}

}  // namespace zrt
