#include "optimizers/cuda/cuda_lion.h"

namespace zrt {

void CudaLion::step(const std::vector<LionDeviceSlice>& slices, double lr, cudaStream_t stream,
                    double grad_scale) {
  table_.launch<LionMath>(slices.data(), slices.size(), lion_step_scalars(options_, lr, grad_scale),
                          stream);
}

}  // namespace zrt
