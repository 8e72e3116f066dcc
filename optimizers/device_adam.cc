#include "optimizers/device_adam.h"

#include "optimizers/cpu_device_step.h"
#include "runtime/common/error.h"
#include "runtime/device/backend_dispatch.h"
#if ZRT_HAVE_CUDA
#include "optimizers/cuda/cuda_adam.h"
#include "runtime/device/cuda_device.h"
#endif

namespace zrt {

namespace {

class CpuDeviceAdam final : public DeviceAdam {
 public:
  using DeviceAdam::step;
  CpuDeviceAdam(const AdamOptions& options, const CpuAdamOptions& cpu)
      : adam_(std::make_shared<const CpuAdam>(options, cpu)) {}

  void step(const std::vector<AdamDeviceSlice>& slices, std::int64_t step, double lr,
            Stream& stream, double grad_scale, DevicePtr<const StepDecision> decision) override {
    adam_step_scalars(adam_->options(), step, lr, grad_scale);  // validates before enqueuing
    detail::enqueue_cpu_step<AdamSlice>(adam_, slices, stream, decision, grad_scale, step, lr);
  }

  const AdamOptions& options() const override { return adam_->options(); }

 private:
  std::shared_ptr<const CpuAdam> adam_;
};

#if ZRT_HAVE_CUDA
class CudaDeviceAdam final : public DeviceAdam {
 public:
  using DeviceAdam::step;
  explicit CudaDeviceAdam(const AdamOptions& options) : adam_(options) {}

  void step(const std::vector<AdamDeviceSlice>& slices, std::int64_t step, double lr,
            Stream& stream, double grad_scale, DevicePtr<const StepDecision> decision) override {
    adam_.step(slices, step, lr, cuda_stream_handle(stream), grad_scale,
               device_access::raw(decision));
  }

  const AdamOptions& options() const override { return adam_.options(); }

 private:
  CudaAdam adam_;
};
#endif

}  // namespace

const OptimizerSpec& DeviceAdam::spec() const {
  static const OptimizerSpec adam = optimizer_spec(OptimizerKind::kAdam);
  return adam;
}

void DeviceAdam::step(const std::vector<OptimizerDeviceSlice>& slices, std::int64_t step, double lr,
                      Stream& stream, double grad_scale, DevicePtr<const StepDecision> decision) {
  this->step(slices_from_generic<AdamDeviceSlice>(slices), step, lr, stream, grad_scale, decision);
}

std::unique_ptr<HostOptimizer> DeviceAdam::make_host_optimizer() const {
  return make_host_adam(options());
}

std::unique_ptr<DeviceAdam> make_device_adam(Device& device, const AdamOptions& options,
                                             const CpuAdamOptions& cpu) {
  if (runs_on_cpu(device)) return std::make_unique<CpuDeviceAdam>(options, cpu);
#if ZRT_HAVE_CUDA
  return std::make_unique<CudaDeviceAdam>(options);
#else
  cuda_backend_missing("Adam on a cuda device");
#endif
}

}  // namespace zrt
