// The per-ISA element loops of CpuAdam. Each vector kernel performs adam_update_element()'s
// operations, in its order, on 8 or 16 lanes; the remainder of a range (< one vector) goes
// through the scalar kernel, which is bit-identical, so where a range starts or ends (the
// thread partition) never changes a result. No FMA (the file is built with
// -ffp-contract=off and the kernels use separate multiply and add intrinsics), no reciprocal
// approximations: division and square root are the IEEE instructions.
//
// Memory: the loops software-prefetch param, grad, m and v kPrefetch elements ahead (the
// hardware prefetchers alone leave about 10% of the bandwidth unused with four read streams and
// compute in between), and on long ranges write the compute-dtype copy with non-temporal stores
// (it is not read here, so a normal store would first read the line: 2 extra bytes per
// parameter).
// GCC 12's AVX-512 conversion intrinsics start from _mm*_undefined_*() values, which its
// middle end reports as maybe-uninitialized once inlined: a known false positive.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>

#include "optimizers/cpu_adam.h"
#include "optimizers/cpu_vector_io.h"

namespace zrt::detail {

namespace {

// ---- per-ISA Adam loops (the loads and stores are in cpu_vector_io.h) ---------------------

template <DType G, OutKind O, AdamDecayMode M>
struct ScalarKernel {
  static void run(const AdamSlice& sl, std::int64_t begin, std::int64_t end,
                  const AdamStepScalars& s) {
    float* const param = sl.param;
    float* const exp_avg = sl.exp_avg;
    float* const exp_avg_sq = sl.exp_avg_sq;
    for (std::int64_t i = begin; i < end; ++i) {
      float p = param[i];
      float m = exp_avg[i];
      float v = exp_avg_sq[i];
      adam_update_element<M>(p, load_grad<G>(sl.grad, i), m, v, s);
      param[i] = p;
      exp_avg[i] = m;
      exp_avg_sq[i] = v;
      store_out<O>(sl.param_out, i, p);
    }
  }
};

template <DType G, OutKind O, AdamDecayMode M>
struct Avx2Kernel {
  // Vector loop over [begin, end - end % 8) from begin; returns where it stopped.
  template <bool kStream>
  ZRT_TARGET_AVX2 static std::int64_t loop(const AdamSlice& sl, std::int64_t begin,
                                           std::int64_t end, const AdamStepScalars& s) {
    float* const param = sl.param;
    float* const exp_avg = sl.exp_avg;
    float* const exp_avg_sq = sl.exp_avg_sq;
    const auto* const grad = static_cast<const std::uint8_t*>(sl.grad);
    constexpr std::int64_t kGradBytes = G == DType::kFloat32 ? 4 : 2;
    const __m256 one_minus_beta1 = _mm256_set1_ps(s.one_minus_beta1);
    const __m256 one_minus_beta2 = _mm256_set1_ps(s.one_minus_beta2);
    const __m256 eps = _mm256_set1_ps(s.eps);
    const __m256 step_size = _mm256_set1_ps(s.step_size);
    const __m256 lr_wd = _mm256_set1_ps(s.lr_wd);
    const __m256 l2 = _mm256_set1_ps(s.l2);
    const __m256 grad_scale = _mm256_set1_ps(s.grad_scale);
    std::int64_t i = begin;
    for (; i + 8 <= end; i += 8) {
      prefetch(param, i + kPrefetch);
      prefetch(exp_avg, i + kPrefetch);
      prefetch(exp_avg_sq, i + kPrefetch);
      prefetch(grad, (i + kPrefetch) * kGradBytes);
      __m256 p = _mm256_loadu_ps(param + i);
      __m256 g = _mm256_mul_ps(load_grad8<G>(sl.grad, i), grad_scale);
      __m256 m = _mm256_loadu_ps(exp_avg + i);
      __m256 v = _mm256_loadu_ps(exp_avg_sq + i);
      if constexpr (M == AdamDecayMode::kL2) g = _mm256_add_ps(g, _mm256_mul_ps(l2, p));
      m = _mm256_add_ps(m, _mm256_mul_ps(one_minus_beta1, _mm256_sub_ps(g, m)));
      v = _mm256_add_ps(v, _mm256_mul_ps(one_minus_beta2, _mm256_sub_ps(_mm256_mul_ps(g, g), v)));
      const __m256 denom = _mm256_add_ps(_mm256_sqrt_ps(v), eps);
      __m256 update = _mm256_div_ps(_mm256_mul_ps(step_size, m), denom);
      if constexpr (M == AdamDecayMode::kDecoupled) {
        update = _mm256_add_ps(update, _mm256_mul_ps(lr_wd, p));
      }
      p = _mm256_sub_ps(p, update);
      _mm256_storeu_ps(param + i, p);
      _mm256_storeu_ps(exp_avg + i, m);
      _mm256_storeu_ps(exp_avg_sq + i, v);
      store_out8<O, kStream>(sl.param_out, i, p);
    }
    return i;
  }

  static void run(const AdamSlice& sl, std::int64_t begin, std::int64_t end,
                  const AdamStepScalars& s) {
    constexpr std::size_t kOutBytes = O == OutKind::kF32 ? 4 : 2;
    const std::int64_t aligned =
        O == OutKind::kNone ? -1 : stream_start(sl.param_out, kOutBytes, 8 * kOutBytes, begin, end);
    std::int64_t i;
    if (aligned >= 0) {
      ScalarKernel<G, O, M>::run(sl, begin, aligned, s);
      i = loop<true>(sl, aligned, end, s);
      _mm_sfence();  // order the streamed lines before whoever reads the copy next
    } else {
      i = loop<false>(sl, begin, end, s);
    }
    ScalarKernel<G, O, M>::run(sl, i, end, s);
  }
};

template <DType G, OutKind O, AdamDecayMode M>
struct Avx512Kernel {
  // Vector loop over [begin, end - end % 16) from begin; returns where it stopped.
  template <bool kStream>
  ZRT_TARGET_AVX512 static std::int64_t loop(const AdamSlice& sl, std::int64_t begin,
                                             std::int64_t end, const AdamStepScalars& s) {
    float* const param = sl.param;
    float* const exp_avg = sl.exp_avg;
    float* const exp_avg_sq = sl.exp_avg_sq;
    const auto* const grad = static_cast<const std::uint8_t*>(sl.grad);
    constexpr std::int64_t kGradBytes = G == DType::kFloat32 ? 4 : 2;
    const __m512 one_minus_beta1 = _mm512_set1_ps(s.one_minus_beta1);
    const __m512 one_minus_beta2 = _mm512_set1_ps(s.one_minus_beta2);
    const __m512 eps = _mm512_set1_ps(s.eps);
    const __m512 step_size = _mm512_set1_ps(s.step_size);
    const __m512 lr_wd = _mm512_set1_ps(s.lr_wd);
    const __m512 l2 = _mm512_set1_ps(s.l2);
    const __m512 grad_scale = _mm512_set1_ps(s.grad_scale);
    std::int64_t i = begin;
    for (; i + 16 <= end; i += 16) {
      prefetch(param, i + kPrefetch);
      prefetch(exp_avg, i + kPrefetch);
      prefetch(exp_avg_sq, i + kPrefetch);
      prefetch(grad, (i + kPrefetch) * kGradBytes);
      __m512 p = _mm512_loadu_ps(param + i);
      __m512 g = _mm512_mul_ps(load_grad16<G>(sl.grad, i), grad_scale);
      __m512 m = _mm512_loadu_ps(exp_avg + i);
      __m512 v = _mm512_loadu_ps(exp_avg_sq + i);
      if constexpr (M == AdamDecayMode::kL2) g = _mm512_add_ps(g, _mm512_mul_ps(l2, p));
      m = _mm512_add_ps(m, _mm512_mul_ps(one_minus_beta1, _mm512_sub_ps(g, m)));
      v = _mm512_add_ps(v, _mm512_mul_ps(one_minus_beta2, _mm512_sub_ps(_mm512_mul_ps(g, g), v)));
      const __m512 denom = _mm512_add_ps(_mm512_sqrt_ps(v), eps);
      __m512 update = _mm512_div_ps(_mm512_mul_ps(step_size, m), denom);
      if constexpr (M == AdamDecayMode::kDecoupled) {
        update = _mm512_add_ps(update, _mm512_mul_ps(lr_wd, p));
      }
      p = _mm512_sub_ps(p, update);
      _mm512_storeu_ps(param + i, p);
      _mm512_storeu_ps(exp_avg + i, m);
      _mm512_storeu_ps(exp_avg_sq + i, v);
      store_out16<O, kStream>(sl.param_out, i, p);
    }
    return i;
  }

  static void run(const AdamSlice& sl, std::int64_t begin, std::int64_t end,
                  const AdamStepScalars& s) {
    constexpr std::size_t kOutBytes = O == OutKind::kF32 ? 4 : 2;
    const std::int64_t aligned =
        O == OutKind::kNone ? -1
                            : stream_start(sl.param_out, kOutBytes, 16 * kOutBytes, begin, end);
    std::int64_t i;
    if (aligned >= 0) {
      ScalarKernel<G, O, M>::run(sl, begin, aligned, s);
      i = loop<true>(sl, aligned, end, s);
      _mm_sfence();  // order the streamed lines before whoever reads the copy next
    } else {
      i = loop<false>(sl, begin, end, s);
    }
    ScalarKernel<G, O, M>::run(sl, i, end, s);
  }
};

// ---- dispatch on (grad dtype, output, decay mode) --------------------------------------------

template <template <DType, OutKind, AdamDecayMode> class K, DType G, OutKind O>
void dispatch_mode(const AdamSlice& sl, std::int64_t b, std::int64_t e, const AdamStepScalars& s) {
  switch (adam_decay_mode(s, sl.weight_decay)) {
    case AdamDecayMode::kNone:
      return K<G, O, AdamDecayMode::kNone>::run(sl, b, e, s);
    case AdamDecayMode::kDecoupled:
      return K<G, O, AdamDecayMode::kDecoupled>::run(sl, b, e, s);
    case AdamDecayMode::kL2:
      return K<G, O, AdamDecayMode::kL2>::run(sl, b, e, s);
  }
}

template <template <DType, OutKind, AdamDecayMode> class K, DType G>
void dispatch_out(const AdamSlice& sl, std::int64_t b, std::int64_t e, const AdamStepScalars& s) {
  switch (out_kind(sl)) {
    case OutKind::kNone:
      return dispatch_mode<K, G, OutKind::kNone>(sl, b, e, s);
    case OutKind::kF32:
      return dispatch_mode<K, G, OutKind::kF32>(sl, b, e, s);
    case OutKind::kBF16:
      return dispatch_mode<K, G, OutKind::kBF16>(sl, b, e, s);
    case OutKind::kF16:
      return dispatch_mode<K, G, OutKind::kF16>(sl, b, e, s);
  }
}

template <template <DType, OutKind, AdamDecayMode> class K>
void dispatch(const AdamSlice& sl, std::int64_t b, std::int64_t e, const AdamStepScalars& s) {
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

void adam_range_scalar(const AdamSlice& slice, std::int64_t begin, std::int64_t end,
                       const AdamStepScalars& s) {
  dispatch<ScalarKernel>(slice, begin, end, s);
}

void adam_range_avx2(const AdamSlice& slice, std::int64_t begin, std::int64_t end,
                     const AdamStepScalars& s) {
  dispatch<Avx2Kernel>(slice, begin, end, s);
}

void adam_range_avx512(const AdamSlice& slice, std::int64_t begin, std::int64_t end,
                       const AdamStepScalars& s) {
  dispatch<Avx512Kernel>(slice, begin, end, s);
}

}  // namespace zrt::detail

#pragma GCC diagnostic pop
