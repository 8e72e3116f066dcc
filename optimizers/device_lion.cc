#include "optimizers/device_lion.h"

#include "optimizers/cpu_device_step.h"
#include "runtime/common/error.h"
#include "runtime/device/backend_dispatch.h"
#if ZRT_HAVE_CUDA
#include "optimizers/cuda/cuda_lion.h"
#include "runtime/device/cuda_device.h"
#endif

namespace zrt {

namespace {

class CpuDeviceLion final : public DeviceLion {
 public:
  using DeviceLion::step;
  CpuDeviceLion(const LionOptions& options, const CpuAdamOptions& cpu)
      : lion_(std::make_shared<const CpuLion>(options, cpu)) {}

  void step(const std::vector<LionDeviceSlice>& slices, double lr, Stream& stream,
            double grad_scale, DevicePtr<const StepDecision> decision) override {
    lion_step_scalars(lion_->options(), lr, grad_scale);  // validates before enqueuing
    detail::enqueue_cpu_step<LionSlice>(lion_, slices, stream, decision, grad_scale, lr);
  }

  const LionOptions& options() const override { return lion_->options(); }

 private:
  std::shared_ptr<const CpuLion> lion_;
};

#if ZRT_HAVE_CUDA
class CudaDeviceLion final : public DeviceLion {
 public:
  using DeviceLion::step;
  explicit CudaDeviceLion(const LionOptions& options) : lion_(options) {}

  void step(const std::vector<LionDeviceSlice>& slices, double lr, Stream& stream,
            double grad_scale, DevicePtr<const StepDecision> decision) override {
    lion_.step(slices, lr, cuda_stream_handle(stream), grad_scale, device_access::raw(decision));
  }

  const LionOptions& options() const override { return lion_.options(); }

 private:
  CudaLion lion_;
};
#endif

}  // namespace

const OptimizerSpec& DeviceLion::spec() const {
  static const OptimizerSpec lion = optimizer_spec(OptimizerKind::kLion);
  return lion;
}

void DeviceLion::step(const std::vector<OptimizerDeviceSlice>& slices, std::int64_t /*step*/,
                      double lr, Stream& stream, double grad_scale,
                      DevicePtr<const StepDecision> decision) {
  this->step(slices_from_generic<LionDeviceSlice>(slices), lr, stream, grad_scale, decision);
}

std::unique_ptr<HostOptimizer> DeviceLion::make_host_optimizer() const {
  return make_host_lion(options());
}

std::unique_ptr<DeviceLion> make_device_lion(Device& device, const LionOptions& options,
                                             const CpuAdamOptions& cpu) {
  if (runs_on_cpu(device)) return std::make_unique<CpuDeviceLion>(options, cpu);
#if ZRT_HAVE_CUDA
  return std::make_unique<CudaDeviceLion>(options);
#else
  cuda_backend_missing("Lion on a cuda device");
#endif
}

}  // namespace zrt
