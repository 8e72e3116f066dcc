// The Lion element update and its per-step scalars, shared by the CPU kernels and the CUDA
// kernel (no host-only dependencies, so .cu files include it directly). The formula and its
// operation order are documented in lion.h.
#pragma once

#include "optimizers/adam_math.h"  // ZRT_HOST_DEVICE

namespace zrt {

// Per-step scalars, computed once on the host in double and rounded to float, so every
// implementation uses identical values.
struct LionStepScalars {
  float grad_scale;  // gradients are multiplied by this first (1: as given)
  float one_minus_beta1;
  float one_minus_beta2;
  float lr;
  float lr_wd;            // lr * wd (slices with weight decay)
  bool has_weight_decay;  // wd > 0
};

// The element update (see lion.h). kDecay: this slice gets weight decay. On the device every
// arithmetic operation is an explicit round-to-nearest intrinsic (never fused); on the host
// plain operators under -ffp-contract=off.
template <bool kDecay>
ZRT_HOST_DEVICE inline void lion_update_element(float& p, float g, float& m,
                                                const LionStepScalars& s) {
#if defined(__CUDA_ARCH__)
  g = __fmul_rn(g, s.grad_scale);
  const float c = __fadd_rn(m, __fmul_rn(s.one_minus_beta1, __fsub_rn(g, m)));
  // lr * sign(c), exactly: +lr, -lr, or c * 0 (a signed zero for c == 0, NaN for a NaN c, so a
  // non-finite gradient that reaches the optimizer shows in the weights as it does in torch).
  float update = c > 0.0f ? s.lr : (c < 0.0f ? -s.lr : __fmul_rn(c, 0.0f));
  if (kDecay) update = __fadd_rn(update, __fmul_rn(s.lr_wd, p));
  p = __fsub_rn(p, update);
  m = __fadd_rn(m, __fmul_rn(s.one_minus_beta2, __fsub_rn(g, m)));
#else
  g = g * s.grad_scale;
  const float c = m + s.one_minus_beta1 * (g - m);
  float update = c > 0.0f ? s.lr : (c < 0.0f ? -s.lr : c * 0.0f);
  if (kDecay) update = update + s.lr_wd * p;
  p = p - update;
  m = m + s.one_minus_beta2 * (g - m);
#endif
}

// Lion for the code written once over optimizers (as AdamMath): the element update on the state
// array {m} (the spec's "exp_avg"), and with_update(), which calls run(Update<kDecay>{}) with
// whether a slice gets weight decay.
struct LionMath {
  using Scalars = LionStepScalars;
  static constexpr int kStates = 1;
  template <bool kDecay>
  struct Update {
    using Scalars = LionStepScalars;
    static constexpr int kStates = 1;
    ZRT_HOST_DEVICE static void element(float& p, float g, float (&state)[1],
                                        const LionStepScalars& s) {
      lion_update_element<kDecay>(p, g, state[0], s);
    }
  };
  ZRT_EXEC_CHECK_DISABLE
  template <typename Run>
  ZRT_HOST_DEVICE static void with_update(const LionStepScalars& s, bool slice_weight_decay,
                                          const Run& run) {
    if (s.has_weight_decay && slice_weight_decay) return run(Update<true>{});
    run(Update<false>{});
  }
};

}  // namespace zrt
