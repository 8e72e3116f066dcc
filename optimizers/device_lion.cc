#include "optimizers/device_lion.h"

#include <utility>

#include "runtime/common/error.h"
#include "runtime/device/device_access.h"
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
            double grad_scale) override {
    lion_step_scalars(lion_->options(), lr, grad_scale);  // validates before enqueuing
    std::vector<LionSlice> host(slices.size());
    for (std::size_t k = 0; k < slices.size(); ++k) {
      const LionDeviceSlice& d = slices[k];
      LionSlice& h = host[k];
      // CPU backend: device memory is host memory.
      h.param = device_access::raw(d.param);
      h.grad = device_access::raw(d.grad);
      h.exp_avg = device_access::raw(d.exp_avg);
      h.param_out = device_access::raw(d.param_out);
      h.numel = d.numel;
      h.grad_dtype = d.grad_dtype;
      h.out_dtype = d.out_dtype;
      h.weight_decay = d.weight_decay;
      validate_lion_slice(h, k);
    }
    stream.host_callback([lion = lion_, host = std::move(host), lr, grad_scale] {
      lion->step(host, lr, grad_scale);
    });
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
            double grad_scale) override {
    lion_.step(slices, lr, cuda_stream_handle(stream), grad_scale);
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
                      double lr, Stream& stream, double grad_scale) {
  std::vector<LionDeviceSlice> lion(slices.size());
  for (std::size_t k = 0; k < slices.size(); ++k) {
    const OptimizerDeviceSlice& s = slices[k];
    LionDeviceSlice& l = lion[k];
    l.param = s.param;
    l.grad = s.grad;
    l.exp_avg = s.state[0];
    l.param_out = s.param_out;
    l.numel = s.numel;
    l.grad_dtype = s.grad_dtype;
    l.out_dtype = s.out_dtype;
    l.weight_decay = s.weight_decay;
  }
  this->step(lion, lr, stream, grad_scale);
}

std::unique_ptr<HostOptimizer> DeviceLion::make_host_optimizer() const {
  return make_host_lion(options());
}

std::unique_ptr<DeviceLion> make_device_lion(Device& device, const LionOptions& options,
                                             const CpuAdamOptions& cpu) {
  if (device.type() == DeviceType::kCpu) return std::make_unique<CpuDeviceLion>(options, cpu);
#if ZRT_HAVE_CUDA
  return std::make_unique<CudaDeviceLion>(options);
#else
  ZRT_THROW(InvalidArgument,
            "Lion on a {} device needs the CUDA backend, which this zrt was built without",
            device_type_name(device.type()));
#endif
}

}  // namespace zrt
