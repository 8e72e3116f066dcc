#include "optimizers/cpu_lion.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "optimizers/slice_threads.h"
#include "runtime/common/error.h"

namespace zrt {

namespace {

using RangeKernel = void (*)(const LionSlice&, std::int64_t, std::int64_t, const LionStepScalars&);

RangeKernel kernel_for(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512:
      return detail::lion_range_avx512;
    case CpuIsa::kAvx2:
      return detail::lion_range_avx2;
    default:
      return detail::lion_range_scalar;
  }
}

}  // namespace

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
  if (s.numel < 0) ZRT_THROW(InvalidArgument, "Lion slice {}: numel {} < 0", index, s.numel);
  if (s.numel == 0) return;
  if (s.param == nullptr || s.grad == nullptr || s.exp_avg == nullptr) {
    ZRT_THROW(InvalidArgument, "Lion slice {} ({} elements): null param, grad or exp_avg", index,
              s.numel);
  }
  if (!is_floating(s.grad_dtype)) {
    ZRT_THROW(InvalidArgument, "Lion slice {}: gradient dtype {} is not fp32, bf16 or fp16", index,
              dtype_name(s.grad_dtype));
  }
  if (s.param_out != nullptr && !is_floating(s.out_dtype)) {
    ZRT_THROW(InvalidArgument, "Lion slice {}: output dtype {} is not fp32, bf16 or fp16", index,
              dtype_name(s.out_dtype));
  }
}

CpuLion::CpuLion(const LionOptions& options, const CpuAdamOptions& cpu)
    : options_(options),
      isa_(cpu.isa == CpuIsa::kAuto ? best_cpu_isa() : cpu.isa),
      num_threads_(cpu.num_threads > 0 ? cpu.num_threads : omp_get_max_threads()) {
  if (!cpu_isa_supported(isa_)) {
    ZRT_THROW(InvalidArgument, "CPU Lion: ISA {} is not supported on this machine (best: {})",
              cpu_isa_name(isa_), cpu_isa_name(hardware_cpu_isa()));
  }
}

void CpuLion::step(const LionSlice* slices, std::size_t count, double lr, double grad_scale) const {
  const auto scalars = lion_step_scalars(options_, lr, grad_scale);
  // Every slice is checked before any memory is touched.
  for (std::size_t k = 0; k < count; ++k) validate_lion_slice(slices[k], k);
  const RangeKernel kernel = kernel_for(isa_);
  detail::for_each_slice_range(
      count, [&](std::size_t k) { return slices[k].numel; }, num_threads_,
      [&](std::size_t k, std::int64_t begin, std::int64_t end) {
        kernel(slices[k], begin, end, scalars);
      });
}

}  // namespace zrt
