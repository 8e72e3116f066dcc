#include "optimizers/cpu_lion.h"

#include <cmath>

#include "optimizers/cpu_slice_step.h"
#include "runtime/common/error.h"

namespace zrt {

LionStepScalars lion_step_scalars(const LionOptions& o, double lr, double grad_scale) {
  if (!(std::isfinite(grad_scale) && grad_scale >= 0.0)) {
    ZRT_THROW(InvalidArgument, "Lion grad_scale must be finite and >= 0, got {}", grad_scale);
  }
  if (!std::isfinite(lr)) ZRT_THROW(InvalidArgument, "Lion lr must be finite, got {}", lr);
  LionStepScalars s{};
  s.grad_scale = static_cast<float>(grad_scale);
  s.one_minus_beta1 = static_cast<float>(1.0 - o.beta1);
  s.one_minus_beta2 = static_cast<float>(1.0 - o.beta2);
  s.lr = static_cast<float>(lr);
  s.lr_wd = static_cast<float>(lr * o.weight_decay);
  s.has_weight_decay = o.weight_decay > 0.0;
  return s;
}

void validate_lion_slice(const LionSlice& s, std::size_t index) {
  validate_slice(s, index);
}

void CpuLion::step(const LionSlice* slices, std::size_t count, double lr, double grad_scale) const {
  detail::step_slices(slices, count, lion_step_scalars(options_, lr, grad_scale),
                      detail::lion_range_kernel(isa_), num_threads_);
}

}  // namespace zrt
