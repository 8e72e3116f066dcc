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
