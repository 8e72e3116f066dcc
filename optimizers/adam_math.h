// The Adam element update and its per-step scalars, shared by the CPU kernels and the CUDA
// kernel (this header has no host-only dependencies, so .cu files include it directly). The
// formula and its operation order are documented in adam.h.
#pragma once

#include <cstdint>

#include "runtime/common/host_device.h"

namespace zrt {

// Per-step scalars, computed once on the host in double and rounded to float, so every
// implementation uses identical values.
struct AdamStepScalars {
  float grad_scale;  // gradients are multiplied by this first (1: as given)
  float one_minus_beta1;
  float one_minus_beta2;
  float eps;        // eps * sqrt(1 - b2^t)   (eps without bias correction)
  float step_size;  // lr * sqrt(1 - b2^t) / (1 - b1^t)   (lr without bias correction)
  float lr_wd;      // lr * wd (AdamW slices with weight decay)
  float l2;         // wd (Adam L2 slices with weight decay)
  bool adam_w_mode;
  bool has_weight_decay;  // wd > 0
};

// Which weight-decay form a slice gets.
enum class AdamDecayMode { kNone, kDecoupled, kL2 };
ZRT_HOST_DEVICE inline AdamDecayMode adam_decay_mode(const AdamStepScalars& s,
                                                     bool slice_weight_decay) {
  if (!s.has_weight_decay || !slice_weight_decay) return AdamDecayMode::kNone;
  return s.adam_w_mode ? AdamDecayMode::kDecoupled : AdamDecayMode::kL2;
}

// The element update (see adam.h). On the device every operation is an explicit
// round-to-nearest intrinsic, which the compiler never fuses or approximates whatever the flags;
// on the host plain operators under -ffp-contract=off and the IEEE sqrt instruction.
template <AdamDecayMode kMode>
ZRT_HOST_DEVICE inline void adam_update_element(float& p, float g, float& m, float& v,
                                                const AdamStepScalars& s) {
#if defined(__CUDA_ARCH__)
  g = __fmul_rn(g, s.grad_scale);
  if (kMode == AdamDecayMode::kL2) g = __fadd_rn(g, __fmul_rn(s.l2, p));
  m = __fadd_rn(m, __fmul_rn(s.one_minus_beta1, __fsub_rn(g, m)));
  v = __fadd_rn(v, __fmul_rn(s.one_minus_beta2, __fsub_rn(__fmul_rn(g, g), v)));
  const float denom = __fadd_rn(__fsqrt_rn(v), s.eps);
  float update = __fdiv_rn(__fmul_rn(s.step_size, m), denom);
  if (kMode == AdamDecayMode::kDecoupled) update = __fadd_rn(update, __fmul_rn(s.lr_wd, p));
  p = __fsub_rn(p, update);
#else
  g = g * s.grad_scale;
  if (kMode == AdamDecayMode::kL2) g = g + s.l2 * p;
  m = m + s.one_minus_beta1 * (g - m);
  v = v + s.one_minus_beta2 * (g * g - v);
  const float denom = __builtin_sqrtf(v) + s.eps;
  float update = (s.step_size * m) / denom;
  if (kMode == AdamDecayMode::kDecoupled) update = update + s.lr_wd * p;
  p = p - update;
#endif
}

// Adam for the code written once over optimizers (the CPU loops, cpu_update_loops.h; the CUDA
// kernel, cuda_multi_tensor.cuh; its stand-in twin): the element update on the state array
// {m, v} (the spec's "exp_avg", "exp_avg_sq"), and with_update(), which calls run(Update<M>{})
// for the weight-decay form M a slice gets.
struct AdamMath {
  using Scalars = AdamStepScalars;
  static constexpr int kStates = 2;
  template <AdamDecayMode kMode>
  struct Update {
    using Scalars = AdamStepScalars;
    static constexpr int kStates = 2;
    ZRT_HOST_DEVICE static void element(float& p, float g, float (&state)[2],
                                        const AdamStepScalars& s) {
      adam_update_element<kMode>(p, g, state[0], state[1], s);
    }
  };
  ZRT_EXEC_CHECK_DISABLE
  template <typename Run>
  ZRT_HOST_DEVICE static void with_update(const AdamStepScalars& s, bool slice_weight_decay,
                                          const Run& run) {
    switch (adam_decay_mode(s, slice_weight_decay)) {
      case AdamDecayMode::kNone:
        return run(Update<AdamDecayMode::kNone>{});
      case AdamDecayMode::kDecoupled:
        return run(Update<AdamDecayMode::kDecoupled>{});
      case AdamDecayMode::kL2:
        return run(Update<AdamDecayMode::kL2>{});
    }
  }
};

}  // namespace zrt
