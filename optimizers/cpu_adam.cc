#include "optimizers/cpu_adam.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "runtime/common/error.h"

namespace zrt {

namespace {

// Threads split the concatenation of all slices into equal ranges whose boundaries are
// multiples of kAlign elements (a 64-byte line of fp32 for aligned slices); below kMinPerThread
// elements per thread another thread costs more than it saves.
constexpr std::int64_t kAlign = 64;
constexpr std::int64_t kMinPerThread = 1 << 15;

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
  const AdamStepScalars scalars = adam_step_scalars(options_, step, lr, grad_scale);
  // ends[k]: one past the last element of slice k in the concatenation of all slices.
  std::vector<std::int64_t> ends(count);
  std::int64_t total = 0;
  for (std::size_t k = 0; k < count; ++k) {
    validate_adam_slice(slices[k], k);
    total += slices[k].numel;
    ends[k] = total;
  }
  if (total == 0) return;
  const RangeKernel kernel = kernel_for(isa_);
  const int threads = static_cast<int>(
      std::clamp<std::int64_t>((total + kMinPerThread - 1) / kMinPerThread, 1, num_threads_));

  // Every element's update depends only on its own inputs, so any partition gives the same
  // bits; a static one keeps each thread's lines its own.
  auto run_range = [&](std::int64_t begin, std::int64_t end) {
    std::size_t k =
        static_cast<std::size_t>(std::upper_bound(ends.begin(), ends.end(), begin) - ends.begin());
    for (; k < count && begin < end; ++k) {
      const std::int64_t slice_begin = ends[k] - slices[k].numel;
      const std::int64_t stop = std::min(end, ends[k]);
      if (stop > begin) kernel(slices[k], begin - slice_begin, stop - slice_begin, scalars);
      begin = stop;
    }
  };
  if (threads == 1) {
    run_range(0, total);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    const std::int64_t t = omp_get_thread_num();
    const std::int64_t n = omp_get_num_threads();
    auto boundary = [&](std::int64_t i) {
      return i == n ? total : std::min(total, total * i / n / kAlign * kAlign);
    };
    run_range(boundary(t), boundary(t + 1));
  }
}

}  // namespace zrt
