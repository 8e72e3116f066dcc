#include "optimizers/cpu_adam.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "optimizers/slice_threads.h"
#include "runtime/common/error.h"

namespace zrt {

namespace {

using RangeKernel = void (*)(const AdamSlice&, std::int64_t, std::int64_t, const AdamStepScalars&);

RangeKernel kernel_for(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512:
      return detail::adam_range_avx512;
    case CpuIsa::kAvx2:
      return detail::adam_range_avx2;
    default:
      return detail::adam_range_scalar;
  }
}

}  // namespace

AdamStepScalars adam_step_scalars(const AdamOptions& o, std::int64_t step, double lr,
                                  double grad_scale) {
  ZRT_CHECK(step >= 1, "Adam steps count from 1, got {}", step);
  if (!(std::isfinite(grad_scale) && grad_scale >= 0.0)) {
    ZRT_THROW(InvalidArgument, "Adam grad_scale must be finite and >= 0, got {}", grad_scale);
  }
  AdamStepScalars s{};
  s.grad_scale = static_cast<float>(grad_scale);
  s.one_minus_beta1 = static_cast<float>(1.0 - o.beta1);
  s.one_minus_beta2 = static_cast<float>(1.0 - o.beta2);
  // Adam's lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps), with numerator and denominator multiplied by
  // sqrt(bc2): the same value with one division and one square root per element, which is what
  // keeps the vector kernels memory-bound (the divider is their bottleneck).
  double step_size = lr;
  double eps = o.eps;
  if (o.bias_correction) {
    const double t = static_cast<double>(step);
    const double bc2_sqrt = std::sqrt(1.0 - std::pow(o.beta2, t));
    step_size = lr / (1.0 - std::pow(o.beta1, t)) * bc2_sqrt;
    eps = o.eps * bc2_sqrt;
  }
  s.step_size = static_cast<float>(step_size);
  s.eps = static_cast<float>(eps);
  s.lr_wd = static_cast<float>(lr * o.weight_decay);
  s.l2 = static_cast<float>(o.weight_decay);
  s.adam_w_mode = o.adam_w_mode;
  s.has_weight_decay = o.weight_decay > 0.0;
  return s;
}

void validate_adam_slice(const AdamSlice& s, std::size_t index) {
  if (s.numel < 0) ZRT_THROW(InvalidArgument, "Adam slice {}: numel {} < 0", index, s.numel);
  if (s.numel == 0) return;
  if (s.param == nullptr || s.grad == nullptr || s.exp_avg == nullptr || s.exp_avg_sq == nullptr) {
    ZRT_THROW(InvalidArgument,
              "Adam slice {} ({} elements): null param, grad, exp_avg or "
              "exp_avg_sq",
              index, s.numel);
  }
  if (!is_floating(s.grad_dtype)) {
    ZRT_THROW(InvalidArgument, "Adam slice {}: gradient dtype {} is not fp32, bf16 or fp16", index,
              dtype_name(s.grad_dtype));
  }
  if (s.param_out != nullptr && !is_floating(s.out_dtype)) {
    ZRT_THROW(InvalidArgument, "Adam slice {}: output dtype {} is not fp32, bf16 or fp16", index,
              dtype_name(s.out_dtype));
  }
}

CpuAdam::CpuAdam(const AdamOptions& options, const CpuAdamOptions& cpu)
    : options_(options),
      isa_(cpu.isa == CpuIsa::kAuto ? best_cpu_isa() : cpu.isa),
      num_threads_(cpu.num_threads > 0 ? cpu.num_threads : omp_get_max_threads()) {
  if (!cpu_isa_supported(isa_)) {
    ZRT_THROW(InvalidArgument, "CPU Adam: ISA {} is not supported on this machine (best: {})",
              cpu_isa_name(isa_), cpu_isa_name(hardware_cpu_isa()));
  }
}

void CpuAdam::step(const AdamSlice* slices, std::size_t count, std::int64_t step, double lr,
                   double grad_scale) const {
  const auto scalars = adam_step_scalars(options_, step, lr, grad_scale);
  // Every slice is checked before any memory is touched.
  for (std::size_t k = 0; k < count; ++k) validate_adam_slice(slices[k], k);
  const RangeKernel kernel = kernel_for(isa_);
  detail::for_each_slice_range(
      count, [&](std::size_t k) { return slices[k].numel; }, num_threads_,
      [&](std::size_t k, std::int64_t begin, std::int64_t end) {
        kernel(slices[k], begin, end, scalars);
      });
}

}  // namespace zrt
