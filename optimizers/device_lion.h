// DeviceLion: Lion as the engine's device-side optimizer, stream-ordered like DeviceAdam: on the
// CPU backend the CpuLion pass runs as a host callback on the stream; on the CUDA backend it is
// one CudaLion kernel launch on the stream. Its single state is "exp_avg" (the momentum).
//
// Thread-safety: one thread at a time (like the stream it enqueues on).
#pragma once

#include <memory>
#include <vector>

#include "optimizers/cpu_lion.h"
#include "optimizers/lion.h"
#include "optimizers/host_optimizers.h"
#include "runtime/device/device.h"

namespace zrt {

class DeviceLion : public DeviceOptimizer {
 public:
  using DeviceOptimizer::step;
  // Enqueues one Lion step with learning rate `lr` over `slices` on `stream` (see CpuLion::step).
  // With a `decision`, as DeviceOptimizer::step says.
  virtual void step(const std::vector<LionDeviceSlice>& slices, double lr, Stream& stream,
                    double grad_scale = 1.0, DevicePtr<const StepDecision> decision = {}) = 0;
  virtual const LionOptions& options() const = 0;

  // DeviceOptimizer: state[0] is "exp_avg"; `step` is not used (Lion has no bias correction).
  const OptimizerSpec& spec() const override;
  void step(const std::vector<OptimizerDeviceSlice>& slices, std::int64_t step, double lr,
            Stream& stream, double grad_scale = 1.0,
            DevicePtr<const StepDecision> decision = {}) override;
  std::unique_ptr<HostOptimizer> make_host_optimizer() const override;
};

// The implementation for `device`'s backend; `cpu` configures the CPU backend's kernel.
std::unique_ptr<DeviceLion> make_device_lion(Device& device, const LionOptions& options,
                                             const CpuAdamOptions& cpu = {});

}  // namespace zrt
