#include "optimizers/cpu_adam.h"

#include <omp.h>

#include <cmath>

#include "optimizers/cpu_slice_step.h"
#include "runtime/common/error.h"

namespace zrt {

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

namespace detail {

template <typename Options>
CpuOptimizerBase<Options>::CpuOptimizerBase(const Options& options, const CpuAdamOptions& cpu,
                                            const char* who)
    : options_(options),
      isa_(cpu.isa == CpuIsa::kAuto ? best_cpu_isa() : cpu.isa),
      num_threads_(cpu.num_threads > 0 ? cpu.num_threads : omp_get_max_threads()) {
  if (!cpu_isa_supported(isa_)) {
    ZRT_THROW(InvalidArgument, "{}: ISA {} is not supported on this machine (best: {})", who,
              cpu_isa_name(isa_), cpu_isa_name(hardware_cpu_isa()));
  }
}

template class CpuOptimizerBase<AdamOptions>;
template class CpuOptimizerBase<LionOptions>;

}  // namespace detail

void validate_adam_slice(const AdamSlice& s, std::size_t index) {
  validate_slice(s, index);
}

void CpuAdam::step(const AdamSlice* slices, std::size_t count, std::int64_t step, double lr,
                   double grad_scale) const {
  detail::step_slices(slices, count, adam_step_scalars(options_, step, lr, grad_scale),
                      detail::adam_range_kernel(isa_), num_threads_);
}

}  // namespace zrt
