// The per-ISA element loops of CpuLion. Each vector kernel performs lion_update_element()'s
// operations, in its order, on 8 or 16 lanes; the remainder of a range goes through the scalar
// kernel, which is bit-identical, so the thread partition never changes a result. sign(c) is two
// ordered compares and blends choosing +lr, -lr or c * 0 (the scalar code's ternary), so ties,
// signed zeros and NaN come out the same on every path. No FMA (-ffp-contract=off; separate
// multiply and add intrinsics).
// GCC 12's AVX-512 conversion intrinsics start from _mm*_undefined_*() values, which its
// middle end reports as maybe-uninitialized once inlined: a known false positive.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>

#include "optimizers/cpu_lion.h"
#include "optimizers/cpu_vector_io.h"

namespace zrt::detail {

namespace {

template <DType G, OutKind O, bool kDecay>
struct ScalarLion {
  static void run(const LionSlice& sl, std::int64_t begin, std::int64_t end,
                  const LionStepScalars& s) {
    float* const param = sl.param;
    float* const exp_avg = sl.exp_avg;
    for (std::int64_t i = begin; i < end; ++i) {
      float p = param[i];
      float m = exp_avg[i];
      lion_update_element<kDecay>(p, load_grad<G>(sl.grad, i), m, s);
      param[i] = p;
      exp_avg[i] = m;
      store_out<O>(sl.param_out, i, p);
    }
  }
};

template <DType G, OutKind O, bool kDecay>
struct Avx2Lion {
  template <bool kStream>
  ZRT_TARGET_AVX2 static std::int64_t loop(const LionSlice& sl, std::int64_t begin,
                                           std::int64_t end, const LionStepScalars& s) {
    float* const param = sl.param;
    float* const exp_avg = sl.exp_avg;
    const auto* const grad = static_cast<const std::uint8_t*>(sl.grad);
    constexpr std::int64_t kGradBytes = G == DType::kFloat32 ? 4 : 2;
    const __m256 one_minus_beta1 = _mm256_set1_ps(s.one_minus_beta1);
    const __m256 one_minus_beta2 = _mm256_set1_ps(s.one_minus_beta2);
    const __m256 lr = _mm256_set1_ps(s.lr);
    const __m256 neg_lr = _mm256_set1_ps(-s.lr);
    const __m256 lr_wd = _mm256_set1_ps(s.lr_wd);
    const __m256 grad_scale = _mm256_set1_ps(s.grad_scale);
    const __m256 zero = _mm256_setzero_ps();
    std::int64_t i = begin;
    for (; i + 8 <= end; i += 8) {
      prefetch(param, i + kPrefetch);
      prefetch(exp_avg, i + kPrefetch);
      prefetch(grad, (i + kPrefetch) * kGradBytes);
      __m256 p = _mm256_loadu_ps(param + i);
      const __m256 g = _mm256_mul_ps(load_grad8<G>(sl.grad, i), grad_scale);
      __m256 m = _mm256_loadu_ps(exp_avg + i);
      const __m256 c = _mm256_add_ps(m, _mm256_mul_ps(one_minus_beta1, _mm256_sub_ps(g, m)));
      __m256 update = _mm256_mul_ps(c, zero);
      update = _mm256_blendv_ps(update, lr, _mm256_cmp_ps(c, zero, _CMP_GT_OQ));
      update = _mm256_blendv_ps(update, neg_lr, _mm256_cmp_ps(c, zero, _CMP_LT_OQ));
      if constexpr (kDecay) update = _mm256_add_ps(update, _mm256_mul_ps(lr_wd, p));
      p = _mm256_sub_ps(p, update);
      m = _mm256_add_ps(m, _mm256_mul_ps(one_minus_beta2, _mm256_sub_ps(g, m)));
      _mm256_storeu_ps(param + i, p);
      _mm256_storeu_ps(exp_avg + i, m);
      store_out8<O, kStream>(sl.param_out, i, p);
    }
    return i;
  }

  static void run(const LionSlice& sl, std::int64_t begin, std::int64_t end,
                  const LionStepScalars& s) {
    constexpr std::size_t kOutBytes = O == OutKind::kF32 ? 4 : 2;
    const std::int64_t aligned =
        O == OutKind::kNone ? -1 : stream_start(sl.param_out, kOutBytes, 8 * kOutBytes, begin, end);
    std::int64_t i;
    if (aligned >= 0) {
      ScalarLion<G, O, kDecay>::run(sl, begin, aligned, s);
      i = loop<true>(sl, aligned, end, s);
      _mm_sfence();  // order the streamed lines before whoever reads the copy next
    } else {
      i = loop<false>(sl, begin, end, s);
    }
    ScalarLion<G, O, kDecay>::run(sl, i, end, s);
  }
};

template <DType G, OutKind O, bool kDecay>
struct Avx512Lion {
  template <bool kStream>
  ZRT_TARGET_AVX512 static std::int64_t loop(const LionSlice& sl, std::int64_t begin,
                                             std::int64_t end, const LionStepScalars& s) {
    float* const param = sl.param;
    float* const exp_avg = sl.exp_avg;
    const auto* const grad = static_cast<const std::uint8_t*>(sl.grad);
    constexpr std::int64_t kGradBytes = G == DType::kFloat32 ? 4 : 2;
    const __m512 one_minus_beta1 = _mm512_set1_ps(s.one_minus_beta1);
    const __m512 one_minus_beta2 = _mm512_set1_ps(s.one_minus_beta2);
    const __m512 lr = _mm512_set1_ps(s.lr);
    const __m512 neg_lr = _mm512_set1_ps(-s.lr);
    const __m512 lr_wd = _mm512_set1_ps(s.lr_wd);
    const __m512 grad_scale = _mm512_set1_ps(s.grad_scale);
    const __m512 zero = _mm512_setzero_ps();
    std::int64_t i = begin;
    for (; i + 16 <= end; i += 16) {
      prefetch(param, i + kPrefetch);
      prefetch(exp_avg, i + kPrefetch);
      prefetch(grad, (i + kPrefetch) * kGradBytes);
      __m512 p = _mm512_loadu_ps(param + i);
      const __m512 g = _mm512_mul_ps(load_grad16<G>(sl.grad, i), grad_scale);
      __m512 m = _mm512_loadu_ps(exp_avg + i);
      const __m512 c = _mm512_add_ps(m, _mm512_mul_ps(one_minus_beta1, _mm512_sub_ps(g, m)));
      __m512 update = _mm512_mul_ps(c, zero);
      update = _mm512_mask_mov_ps(update, _mm512_cmp_ps_mask(c, zero, _CMP_GT_OQ), lr);
      update = _mm512_mask_mov_ps(update, _mm512_cmp_ps_mask(c, zero, _CMP_LT_OQ), neg_lr);
      if constexpr (kDecay) update = _mm512_add_ps(update, _mm512_mul_ps(lr_wd, p));
      p = _mm512_sub_ps(p, update);
      m = _mm512_add_ps(m, _mm512_mul_ps(one_minus_beta2, _mm512_sub_ps(g, m)));
      _mm512_storeu_ps(param + i, p);
      _mm512_storeu_ps(exp_avg + i, m);
      store_out16<O, kStream>(sl.param_out, i, p);
    }
    return i;
  }

  static void run(const LionSlice& sl, std::int64_t begin, std::int64_t end,
                  const LionStepScalars& s) {
    constexpr std::size_t kOutBytes = O == OutKind::kF32 ? 4 : 2;
    const std::int64_t aligned =
        O == OutKind::kNone ? -1
                            : stream_start(sl.param_out, kOutBytes, 16 * kOutBytes, begin, end);
    std::int64_t i;
    if (aligned >= 0) {
      ScalarLion<G, O, kDecay>::run(sl, begin, aligned, s);
      i = loop<true>(sl, aligned, end, s);
      _mm_sfence();
    } else {
      i = loop<false>(sl, begin, end, s);
    }
    ScalarLion<G, O, kDecay>::run(sl, i, end, s);
  }
};

template <template <DType, OutKind, bool> class K, DType G, OutKind O>
void dispatch_decay(const LionSlice& sl, std::int64_t b, std::int64_t e, const LionStepScalars& s) {
  if (s.has_weight_decay && sl.weight_decay) return K<G, O, true>::run(sl, b, e, s);
  K<G, O, false>::run(sl, b, e, s);
}

template <template <DType, OutKind, bool> class K, DType G>
void dispatch_out(const LionSlice& sl, std::int64_t b, std::int64_t e, const LionStepScalars& s) {
  switch (out_kind(sl)) {
    case OutKind::kNone:
      return dispatch_decay<K, G, OutKind::kNone>(sl, b, e, s);
    case OutKind::kF32:
      return dispatch_decay<K, G, OutKind::kF32>(sl, b, e, s);
    case OutKind::kBF16:
      return dispatch_decay<K, G, OutKind::kBF16>(sl, b, e, s);
    case OutKind::kF16:
      return dispatch_decay<K, G, OutKind::kF16>(sl, b, e, s);
  }
}

template <template <DType, OutKind, bool> class K>
void dispatch(const LionSlice& sl, std::int64_t b, std::int64_t e, const LionStepScalars& s) {
  switch (sl.grad_dtype) {
    case DType::kBFloat16:
      return dispatch_out<K, DType::kBFloat16>(sl, b, e, s);
    case DType::kFloat16:
      return dispatch_out<K, DType::kFloat16>(sl, b, e, s);
    default:
      return dispatch_out<K, DType::kFloat32>(sl, b, e, s);
  }
}

}  // namespace

void lion_range_scalar(const LionSlice& slice, std::int64_t begin, std::int64_t end,
                       const LionStepScalars& s) {
  dispatch<ScalarLion>(slice, begin, end, s);
}

void lion_range_avx2(const LionSlice& slice, std::int64_t begin, std::int64_t end,
                     const LionStepScalars& s) {
  dispatch<Avx2Lion>(slice, begin, end, s);
}

void lion_range_avx512(const LionSlice& slice, std::int64_t begin, std::int64_t end,
                       const LionStepScalars& s) {
  dispatch<Avx512Lion>(slice, begin, end, s);
}

}  // namespace zrt::detail

#pragma GCC diagnostic pop
