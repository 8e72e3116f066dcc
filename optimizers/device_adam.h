// DeviceAdam: the optimizer seam the engine calls when the optimizer state lives in device
// memory. step() is stream-ordered on both backends: on the CPU backend the CpuAdam pass runs as
// a host callback on the stream (so it follows the reduce-scatter that produced the gradients,
// and later work on the stream, e.g. the all-gather of the updated parameters, follows it); on
// the CUDA backend it is one CudaAdam kernel launch on the stream.
//
// Thread-safety: one thread at a time (like the stream it enqueues on).
#pragma once

#include <memory>
#include <vector>

#include "optimizers/adam.h"
#include "optimizers/cpu_adam.h"
#include "optimizers/host_optimizers.h"
#include "optimizers/optimizer_config.h"
#include "runtime/device/device.h"

namespace zrt {

class DeviceAdam : public DeviceOptimizer {
 public:
  using DeviceOptimizer::step;

  // Enqueues Adam step `step` (1-based) with learning rate `lr` over `slices` on `stream`,
  // gradients multiplied by `grad_scale` (see CpuAdam::step), or as `decision` says when given
  // (DeviceOptimizer::step); the slices' memory must stay valid until the stream reaches this
  // point. Throws InvalidArgument for a malformed slice, step < 1 or a bad grad_scale before
  // enqueuing anything.
  virtual void step(const std::vector<AdamDeviceSlice>& slices, std::int64_t step, double lr,
                    Stream& stream, double grad_scale = 1.0,
                    DevicePtr<const StepDecision> decision = {}) = 0;

  virtual const AdamOptions& options() const = 0;

  // DeviceOptimizer: the engine's view (states "exp_avg", "exp_avg_sq" in that order).
  const OptimizerSpec& spec() const override;
  void step(const std::vector<OptimizerDeviceSlice>& slices, std::int64_t step, double lr,
            Stream& stream, double grad_scale = 1.0,
            DevicePtr<const StepDecision> decision = {}) override;
  std::unique_ptr<HostOptimizer> make_host_optimizer() const override;
};

// The implementation for `device`'s backend. `cpu` configures the CPU backend's kernel (ISA,
// threads) and is ignored on CUDA.
std::unique_ptr<DeviceAdam> make_device_adam(Device& device, const AdamOptions& options,
                                             const CpuAdamOptions& cpu = {});

}  // namespace zrt
