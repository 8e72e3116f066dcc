#include "optimizers/optimizer.h"

#include "optimizers/cpu_adam.h"
#include "optimizers/cpu_lion.h"
#include "optimizers/device_adam.h"
#include "optimizers/device_lion.h"

namespace zrt {

OptimizerSpec optimizer_spec(OptimizerKind kind) {
  OptimizerSpec spec;
  if (kind == OptimizerKind::kLion) {
    spec.family = "Lion";
    spec.state_names = {"exp_avg"};
    spec.state_description = "Lion momentum";
  }
  return spec;
}

OptimizerSpec optimizer_spec(const OptimizerConfig& config) {
  return optimizer_spec(config.is_lion() ? OptimizerKind::kLion : OptimizerKind::kAdam);
}

namespace {

class HostAdam final : public HostOptimizer {
 public:
  HostAdam(const AdamOptions& options, const CpuAdamOptions& cpu)
      : adam_(options, cpu), spec_(optimizer_spec(OptimizerKind::kAdam)) {}
  void step(const std::vector<OptimizerSlice>& slices, std::int64_t step, double lr,
            double grad_scale) const override {
    adam_.step(slices_from_generic<AdamSlice>(slices), step, lr, grad_scale);
  }
  const OptimizerSpec& spec() const override { return spec_; }

 private:
  CpuAdam adam_;
  OptimizerSpec spec_;
};

class HostLion final : public HostOptimizer {
 public:
  HostLion(const LionOptions& options, const CpuAdamOptions& cpu)
      : lion_(options, cpu), spec_(optimizer_spec(OptimizerKind::kLion)) {}
  void step(const std::vector<OptimizerSlice>& slices, std::int64_t /*step*/, double lr,
            double grad_scale) const override {
    lion_.step(slices_from_generic<LionSlice>(slices), lr, grad_scale);
  }
  const OptimizerSpec& spec() const override { return spec_; }

 private:
  CpuLion lion_;
  OptimizerSpec spec_;
};

}  // namespace

std::unique_ptr<HostOptimizer> make_host_adam(const AdamOptions& options,
                                              const CpuAdamOptions& cpu) {
  return std::make_unique<HostAdam>(options, cpu);
}

std::unique_ptr<HostOptimizer> make_host_lion(const LionOptions& options,
                                              const CpuAdamOptions& cpu) {
  return std::make_unique<HostLion>(options, cpu);
}

std::unique_ptr<DeviceOptimizer> make_device_optimizer(Device& device,
                                                       const OptimizerConfig& config,
                                                       const CpuAdamOptions& cpu) {
  if (config.is_lion()) return make_device_lion(device, config.lion, cpu);
  return make_device_adam(device, config.adam, cpu);
}

}  // namespace zrt
