#include "optimizers/host_optimizers.h"

#include "optimizers/cpu_adam.h"
#include "optimizers/cpu_lion.h"

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
  RangeStep prepare_step(std::int64_t step, double lr, double grad_scale,
                         StepWrites writes) const override {
    const AdamStepScalars s = adam_step_scalars(adam_.options(), step, lr, grad_scale);
    const detail::AdamRangeKernel kernel = detail::adam_range_kernel(adam_.isa(), writes);
    return [s, kernel](const OptimizerSlice& slice, std::int64_t begin, std::int64_t end) {
      kernel(slice_from_generic<AdamSlice>(slice), begin, end, s);
    };
  }
  void validate(const OptimizerSlice& slice, std::size_t index) const override {
    validate_adam_slice(slice_from_generic<AdamSlice>(slice), index);
  }
  int threads() const override { return adam_.num_threads(); }

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
  RangeStep prepare_step(std::int64_t /*step*/, double lr, double grad_scale,
                         StepWrites writes) const override {
    const LionStepScalars s = lion_step_scalars(lion_.options(), lr, grad_scale);
    const detail::LionRangeKernel kernel = detail::lion_range_kernel(lion_.isa(), writes);
    return [s, kernel](const OptimizerSlice& slice, std::int64_t begin, std::int64_t end) {
      kernel(slice_from_generic<LionSlice>(slice), begin, end, s);
    };
  }
  void validate(const OptimizerSlice& slice, std::size_t index) const override {
    validate_lion_slice(slice_from_generic<LionSlice>(slice), index);
  }
  int threads() const override { return lion_.num_threads(); }

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

}  // namespace zrt
