// Building the optimizer a config names (Adam, AdamW, Lion) for a backend: the factories behind
// the engine's optimizer interface (runtime/engine/optimizer_interface.h), which says what an
// optimizer is to the rest of zrt.
#pragma once

#include <memory>

#include "optimizers/cpu_adam.h"  // CpuAdamOptions: the CPU kernels' ISA and thread choice
#include "optimizers/optimizer_config.h"
#include "runtime/engine/optimizer_interface.h"

namespace zrt {

enum class OptimizerKind { kAdam, kLion };

// The spec of the optimizer `config` selects.
OptimizerSpec optimizer_spec(const OptimizerConfig& config);
OptimizerSpec optimizer_spec(OptimizerKind kind);

// The optimizer `config` selects, for `device`'s backend. `cpu` configures the CPU kernels
// (ISA, threads) on the CPU backend.
std::unique_ptr<DeviceOptimizer> make_device_optimizer(Device& device,
                                                       const OptimizerConfig& config,
                                                       const CpuAdamOptions& cpu = {});
// Host optimizers by kind (offload, tests).
std::unique_ptr<HostOptimizer> make_host_adam(const AdamOptions& options,
                                              const CpuAdamOptions& cpu = {});
std::unique_ptr<HostOptimizer> make_host_lion(const LionOptions& options,
                                              const CpuAdamOptions& cpu = {});

}  // namespace zrt
