// The step's global decision taken where the gradient norm is: on the device. From the squared
// norm of the whole gradient (summed over ranks) it gives whether the step applies (the norm is
// finite) and the factor the optimizer multiplies the gradients by (the average over the
// micro-batches and the loss scale, times DeepSpeed's clipping coefficient when clipping is on).
//
// The engine's decision kernel writes a StepDecision into device memory and the optimizer
// kernels read it there, so the host enqueues the update without waiting for the norm; it
// reads the norm later (ZeroEngine::settle_step). Header-only, no host-only dependencies: the
// CUDA kernels and their CPU twins include it and compute the same bits.
#pragma once

#include <cstdint>

#include "runtime/common/host_device.h"

#if !defined(__CUDA_ARCH__)
#include <cmath>
#endif

namespace zrt {

// In device memory; read by the optimizers' stream-ordered step (DeviceOptimizer::step).
struct StepDecision {
  float grad_scale = 1.0f;  // gradients are multiplied by this (as the optimizers' grad_scale)
  std::int32_t apply = 1;   // 0: a non-finite norm; the step writes nothing anywhere
};

// What the engine's step takes the decision from, besides the norm.
struct StepDecisionInputs {
  double divisor = 1.0;   // gradient_accumulation_steps x loss scale (the gradients' sum of it)
  double clipping = 0.0;  // gradient_clipping; 0: off
};

// The global L2 norm of the averaged, unscaled gradient: sqrt(norm_squared) / divisor, in
// double. Every operation is IEEE round-to-nearest on both sides (explicit intrinsics on the
// device, where nvcc would otherwise be free to contract), so the host's figure and the
// device's decision agree bit for bit.
ZRT_HOST_DEVICE inline double step_grad_norm(float norm_squared, const StepDecisionInputs& in) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(__dsqrt_rn(static_cast<double>(norm_squared)), in.divisor);
#else
  return std::sqrt(static_cast<double>(norm_squared)) / in.divisor;
#endif
}

// The decision (see above). The clipping coefficient is DeepSpeed's: clipping / (norm + 1e-6),
// applied only when below 1.
ZRT_HOST_DEVICE inline StepDecision decide_step(float norm_squared, const StepDecisionInputs& in) {
  StepDecision d;
#if defined(__CUDA_ARCH__)
  const bool finite = isfinite(norm_squared);
#else
  const bool finite = std::isfinite(norm_squared);
#endif
  d.apply = finite ? 1 : 0;
  if (!finite) return d;
  const double norm = step_grad_norm(norm_squared, in);
#if defined(__CUDA_ARCH__)
  double factor = __ddiv_rn(1.0, in.divisor);
  if (in.clipping > 0.0) {
    const double clip = __ddiv_rn(in.clipping, __dadd_rn(norm, 1e-6));
    if (clip < 1.0) factor = __dmul_rn(factor, clip);
  }
#else
  double factor = 1.0 / in.divisor;
  if (in.clipping > 0.0) {
    const double clip = in.clipping / (norm + 1e-6);
    if (clip < 1.0) factor *= clip;
  }
#endif
  d.grad_scale = static_cast<float>(factor);
  return d;
}

}  // namespace zrt
