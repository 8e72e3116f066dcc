// Building the optimizer a config names (Adam, AdamW, Lion) for a backend: the factories behind
// the engine's optimizer interface (runtime/engine/optimizer_interface.h), which says what an
// optimizer is to the rest of zrt. The host optimizers and the specs live one layer below, in
// host_optimizers.h (included here for the callers that use both).
#pragma once

#include <memory>

#include "optimizers/cpu_adam.h"  // CpuAdamOptions: the CPU kernels' ISA and thread choice
#include "optimizers/host_optimizers.h"
#include "optimizers/optimizer_config.h"
#include "runtime/engine/optimizer_interface.h"

namespace zrt {

// The optimizer `config` selects, for `device`'s backend. `cpu` configures the CPU kernels
// (ISA, threads) on the CPU backend.
std::unique_ptr<DeviceOptimizer> make_device_optimizer(Device& device,
                                                       const OptimizerConfig& config,
                                                       const CpuAdamOptions& cpu = {});

}  // namespace zrt
