#include "optimizers/optimizer.h"

#include "optimizers/device_adam.h"
#include "optimizers/device_lion.h"

namespace zrt {

std::unique_ptr<DeviceOptimizer> make_device_optimizer(Device& device,
                                                       const OptimizerConfig& config,
                                                       const CpuAdamOptions& cpu) {
  if (config.is_lion()) return make_device_lion(device, config.lion, cpu);
  return make_device_adam(device, config.adam, cpu);
}

}  // namespace zrt
