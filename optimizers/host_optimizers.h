// The host optimizers (AdamW/Adam and Lion stepping fp32 slices in host memory with zrt's CPU
// kernels) and the optimizers' specs: the layer below the backend factories of optimizer.h,
// which the device optimizers (device_adam.h, device_lion.h) build their host twins with.
#pragma once

#include <memory>

#include "optimizers/adam.h"
#include "optimizers/cpu_adam.h"  // CpuAdamOptions: the CPU kernels' ISA and thread choice
#include "optimizers/lion.h"
#include "optimizers/optimizer_config.h"
#include "runtime/engine/optimizer_interface.h"

namespace zrt {

enum class OptimizerKind { kAdam, kLion };

// The spec of the optimizer `config` selects.
OptimizerSpec optimizer_spec(const OptimizerConfig& config);
OptimizerSpec optimizer_spec(OptimizerKind kind);

// Host optimizers by kind (offload, tests).
std::unique_ptr<HostOptimizer> make_host_adam(const AdamOptions& options,
                                              const CpuAdamOptions& cpu = {});
std::unique_ptr<HostOptimizer> make_host_lion(const LionOptions& options,
                                              const CpuAdamOptions& cpu = {});

}  // namespace zrt
