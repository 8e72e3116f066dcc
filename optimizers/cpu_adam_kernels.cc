// CpuAdam on vectors, for the shared per-ISA loops (cpu_update_loops.h): the 8- and 16-lane
// forms of adam_update_element() (adam_math.h, which the loops use for single elements),
// performing its operations in its order. No FMA (the file is built with -ffp-contract=off and
// the lanes use separate multiply and add intrinsics), no reciprocal approximations: division
// and square root are the IEEE instructions.
// GCC 12's AVX-512 conversion intrinsics start from _mm*_undefined_*() values, which its
// middle end reports as maybe-uninitialized once inlined: a known false positive.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>

#include "optimizers/cpu_adam.h"
#include "optimizers/cpu_update_loops.h"

namespace zrt::detail {

namespace {

template <AdamDecayMode M>
struct CpuLanes<AdamMath::Update<M>> {
  struct Lanes8 {
    __m256 grad_scale, one_minus_beta1, one_minus_beta2, eps, step_size, lr_wd, l2;
    ZRT_TARGET_AVX2 explicit Lanes8(const AdamStepScalars& s)
        : grad_scale(_mm256_set1_ps(s.grad_scale)),
          one_minus_beta1(_mm256_set1_ps(s.one_minus_beta1)),
          one_minus_beta2(_mm256_set1_ps(s.one_minus_beta2)),
          eps(_mm256_set1_ps(s.eps)),
          step_size(_mm256_set1_ps(s.step_size)),
          lr_wd(_mm256_set1_ps(s.lr_wd)),
          l2(_mm256_set1_ps(s.l2)) {}
    ZRT_TARGET_AVX2 void operator()(__m256& p, __m256 g, __m256 (&state)[2]) const {
      __m256& m = state[0];
      __m256& v = state[1];
      g = _mm256_mul_ps(g, grad_scale);
      if constexpr (M == AdamDecayMode::kL2) g = _mm256_add_ps(g, _mm256_mul_ps(l2, p));
      m = _mm256_add_ps(m, _mm256_mul_ps(one_minus_beta1, _mm256_sub_ps(g, m)));
      v = _mm256_add_ps(v, _mm256_mul_ps(one_minus_beta2, _mm256_sub_ps(_mm256_mul_ps(g, g), v)));
      const __m256 denom = _mm256_add_ps(_mm256_sqrt_ps(v), eps);
      __m256 update = _mm256_div_ps(_mm256_mul_ps(step_size, m), denom);
      if constexpr (M == AdamDecayMode::kDecoupled) {
        update = _mm256_add_ps(update, _mm256_mul_ps(lr_wd, p));
      }
      p = _mm256_sub_ps(p, update);
    }
  };

  struct Lanes16 {
    __m512 grad_scale, one_minus_beta1, one_minus_beta2, eps, step_size, lr_wd, l2;
    ZRT_TARGET_AVX512 explicit Lanes16(const AdamStepScalars& s)
        : grad_scale(_mm512_set1_ps(s.grad_scale)),
          one_minus_beta1(_mm512_set1_ps(s.one_minus_beta1)),
          one_minus_beta2(_mm512_set1_ps(s.one_minus_beta2)),
          eps(_mm512_set1_ps(s.eps)),
          step_size(_mm512_set1_ps(s.step_size)),
          lr_wd(_mm512_set1_ps(s.lr_wd)),
          l2(_mm512_set1_ps(s.l2)) {}
    ZRT_TARGET_AVX512 void operator()(__m512& p, __m512 g, __m512 (&state)[2]) const {
      __m512& m = state[0];
      __m512& v = state[1];
      g = _mm512_mul_ps(g, grad_scale);
      if constexpr (M == AdamDecayMode::kL2) g = _mm512_add_ps(g, _mm512_mul_ps(l2, p));
      m = _mm512_add_ps(m, _mm512_mul_ps(one_minus_beta1, _mm512_sub_ps(g, m)));
      v = _mm512_add_ps(v, _mm512_mul_ps(one_minus_beta2, _mm512_sub_ps(_mm512_mul_ps(g, g), v)));
      const __m512 denom = _mm512_add_ps(_mm512_sqrt_ps(v), eps);
      __m512 update = _mm512_div_ps(_mm512_mul_ps(step_size, m), denom);
      if constexpr (M == AdamDecayMode::kDecoupled) {
        update = _mm512_add_ps(update, _mm512_mul_ps(lr_wd, p));
      }
      p = _mm512_sub_ps(p, update);
    }
  };
};

}  // namespace

AdamRangeKernel adam_range_kernel(CpuIsa isa, StepWrites writes) {
  return range_kernel_for<AdamMath, AdamSlice>(isa, writes);
}

}  // namespace zrt::detail

#pragma GCC diagnostic pop
