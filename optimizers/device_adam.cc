#include "optimizers/device_adam.h"

#include <utility>

#include "runtime/common/error.h"
#include "runtime/device/backend_dispatch.h"
#include "runtime/device/device_access.h"
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
            Stream& stream, double grad_scale) override {
    adam_step_scalars(adam_->options(), step, lr, grad_scale);  // validates before enqueuing
    std::vector<AdamSlice> host(slices.size());
    for (std::size_t k = 0; k < slices.size(); ++k) {
      const AdamDeviceSlice& d = slices[k];
      AdamSlice& h = host[k];
      // CPU backend: device memory is host memory.
      h.param = device_access::raw(d.param);
      h.grad = device_access::raw(d.grad);
      h.exp_avg = device_access::raw(d.exp_avg);
      h.exp_avg_sq = device_access::raw(d.exp_avg_sq);
      h.param_out = device_access::raw(d.param_out);
      h.numel = d.numel;
      h.grad_dtype = d.grad_dtype;
      h.out_dtype = d.out_dtype;
      h.weight_decay = d.weight_decay;
      validate_adam_slice(h, k);
    }
    stream.host_callback([adam = adam_, host = std::move(host), step, lr, grad_scale] {
      adam->step(host, step, lr, grad_scale);
    });
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
            Stream& stream, double grad_scale) override {
    adam_.step(slices, step, lr, cuda_stream_handle(stream), grad_scale);
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
                      Stream& stream, double grad_scale) {
  std::vector<AdamDeviceSlice> adam(slices.size());
  for (std::size_t k = 0; k < slices.size(); ++k) {
    const OptimizerDeviceSlice& s = slices[k];
    AdamDeviceSlice& a = adam[k];
    a.param = s.param;
    a.grad = s.grad;
    a.exp_avg = s.state[0];
    a.exp_avg_sq = s.state[1];
    a.param_out = s.param_out;
    a.numel = s.numel;
    a.grad_dtype = s.grad_dtype;
    a.out_dtype = s.out_dtype;
    a.weight_decay = s.weight_decay;
  }
  this->step(adam, step, lr, stream, grad_scale);
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
