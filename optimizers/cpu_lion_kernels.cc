// CpuLion on vectors, for the shared per-ISA loops (cpu_update_loops.h): the 8- and 16-lane
// forms of lion_update_element() (lion_math.h, which the loops use for single elements),
// performing its operations in its order. sign(c) is two ordered compares and blends choosing
// +lr, -lr or c * 0 (the scalar code's ternary), so ties, signed zeros and NaN come out the same
// on every path. No FMA (-ffp-contract=off; separate multiply and add intrinsics).
// GCC 12's AVX-512 conversion intrinsics start from _mm*_undefined_*() values, which its
// middle end reports as maybe-uninitialized once inlined: a known false positive.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>

#include "optimizers/cpu_lion.h"
#include "optimizers/cpu_update_loops.h"

namespace zrt::detail {

namespace {

template <bool kDecay>
struct CpuLanes<LionMath::Update<kDecay>> {
  struct Lanes8 {
    __m256 grad_scale, one_minus_beta1, one_minus_beta2, lr, neg_lr, lr_wd, zero;
    ZRT_TARGET_AVX2 explicit Lanes8(const LionStepScalars& s)
        : grad_scale(_mm256_set1_ps(s.grad_scale)),
          one_minus_beta1(_mm256_set1_ps(s.one_minus_beta1)),
          one_minus_beta2(_mm256_set1_ps(s.one_minus_beta2)),
          lr(_mm256_set1_ps(s.lr)),
          neg_lr(_mm256_set1_ps(-s.lr)),
          lr_wd(_mm256_set1_ps(s.lr_wd)),
          zero(_mm256_setzero_ps()) {}
    ZRT_TARGET_AVX2 void operator()(__m256& p, __m256 g, __m256 (&state)[1]) const {
      __m256& m = state[0];
      g = _mm256_mul_ps(g, grad_scale);
      const __m256 c = _mm256_add_ps(m, _mm256_mul_ps(one_minus_beta1, _mm256_sub_ps(g, m)));
      __m256 update = _mm256_mul_ps(c, zero);
      update = _mm256_blendv_ps(update, lr, _mm256_cmp_ps(c, zero, _CMP_GT_OQ));
      update = _mm256_blendv_ps(update, neg_lr, _mm256_cmp_ps(c, zero, _CMP_LT_OQ));
      if constexpr (kDecay) update = _mm256_add_ps(update, _mm256_mul_ps(lr_wd, p));
      p = _mm256_sub_ps(p, update);
      m = _mm256_add_ps(m, _mm256_mul_ps(one_minus_beta2, _mm256_sub_ps(g, m)));
    }
  };

  struct Lanes16 {
    __m512 grad_scale, one_minus_beta1, one_minus_beta2, lr, neg_lr, lr_wd, zero;
    ZRT_TARGET_AVX512 explicit Lanes16(const LionStepScalars& s)
        : grad_scale(_mm512_set1_ps(s.grad_scale)),
          one_minus_beta1(_mm512_set1_ps(s.one_minus_beta1)),
          one_minus_beta2(_mm512_set1_ps(s.one_minus_beta2)),
          lr(_mm512_set1_ps(s.lr)),
          neg_lr(_mm512_set1_ps(-s.lr)),
          lr_wd(_mm512_set1_ps(s.lr_wd)),
          zero(_mm512_setzero_ps()) {}
    ZRT_TARGET_AVX512 void operator()(__m512& p, __m512 g, __m512 (&state)[1]) const {
      __m512& m = state[0];
      g = _mm512_mul_ps(g, grad_scale);
      const __m512 c = _mm512_add_ps(m, _mm512_mul_ps(one_minus_beta1, _mm512_sub_ps(g, m)));
      __m512 update = _mm512_mul_ps(c, zero);
      update = _mm512_mask_mov_ps(update, _mm512_cmp_ps_mask(c, zero, _CMP_GT_OQ), lr);
      update = _mm512_mask_mov_ps(update, _mm512_cmp_ps_mask(c, zero, _CMP_LT_OQ), neg_lr);
      if constexpr (kDecay) update = _mm512_add_ps(update, _mm512_mul_ps(lr_wd, p));
      p = _mm512_sub_ps(p, update);
      m = _mm512_add_ps(m, _mm512_mul_ps(one_minus_beta2, _mm512_sub_ps(g, m)));
    }
  };
};

}  // namespace

LionRangeKernel lion_range_kernel(CpuIsa isa, StepWrites writes) {
  return range_kernel_for<LionMath, LionSlice>(isa, writes);
}

}  // namespace zrt::detail

#pragma GCC diagnostic pop
