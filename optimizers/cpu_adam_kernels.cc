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

#define ZRT_TARGET_AVX2 __attribute__((target("avx2,f16c")))
#define ZRT_TARGET_AVX512 __attribute__((target("avx512f")))

namespace zrt::detail {

namespace {

constexpr std::int64_t kPrefetch = 512;       // elements ahead (2 KiB of fp32)
constexpr std::int64_t kStreamMin = 1 << 20;  // range length from which the copy streams

// The first element >= begin at which out + i is aligned to `bytes` (a vector store), or -1 if
// the range is too short to stream or the pointer can never be aligned.
inline std::int64_t stream_start(const void* out, std::size_t elem_size, std::size_t bytes,
                                 std::int64_t begin, std::int64_t end) {
  if (out == nullptr || end - begin < kStreamMin) return -1;
  const std::uintptr_t addr = reinterpret_cast<std::uintptr_t>(out) + begin * elem_size;
  const std::uintptr_t misalign = addr % bytes;
  if (misalign % elem_size != 0) return -1;
  return begin + static_cast<std::int64_t>((bytes - misalign) % bytes / elem_size);
}

template <typename T>
inline void prefetch(const T* base, std::int64_t i) {
  _mm_prefetch(reinterpret_cast<const char*>(base + i), _MM_HINT_T0);
}

enum class OutKind { kNone, kF32, kBF16, kF16 };

OutKind out_kind(const AdamSlice& slice) {
  if (slice.param_out == nullptr) return OutKind::kNone;
  switch (slice.out_dtype) {
    case DType::kFloat32:
      return OutKind::kF32;
    case DType::kBFloat16:
      return OutKind::kBF16;
    default:
      return OutKind::kF16;
  }
}

// ---- scalar ------------------------------------------------------------------------------

template <DType G>
inline float load_grad(const void* grad, std::int64_t i) {
  if constexpr (G == DType::kFloat32) {
    return static_cast<const float*>(grad)[i];
  } else if constexpr (G == DType::kBFloat16) {
    return to_float(static_cast<const bf16*>(grad)[i]);
  } else {
    return to_float(static_cast<const fp16*>(grad)[i]);
  }
}

template <OutKind O>
inline void store_out(void* out, std::int64_t i, float p) {
  if constexpr (O == OutKind::kF32) {
    static_cast<float*>(out)[i] = p;
  } else if constexpr (O == OutKind::kBF16) {
    static_cast<bf16*>(out)[i] = to_bf16(p);
  } else if constexpr (O == OutKind::kF16) {
    static_cast<fp16*>(out)[i] = to_fp16(p);
  }
}

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

// ---- AVX2 + F16C: 8 lanes ------------------------------------------------------------------

template <DType G>
ZRT_TARGET_AVX2 inline __m256 load_grad8(const void* grad, std::int64_t i) {
  if constexpr (G == DType::kFloat32) {
    return _mm256_loadu_ps(static_cast<const float*>(grad) + i);
  } else {
    const __m128i h = _mm_loadu_si128(
        reinterpret_cast<const __m128i*>(static_cast<const std::uint16_t*>(grad) + i));
    if constexpr (G == DType::kBFloat16) {
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    } else {
      return _mm256_cvtph_ps(h);  // exact
    }
  }
}

// NaN lanes of the 32-bit lanes u, as all-ones.
ZRT_TARGET_AVX2 inline __m256i nan_lanes8(__m256i u) {
  const __m256i abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
  return _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));  // both operands >= 0
}

// Packs eight 32-bit lanes holding 16-bit values into eight uint16.
ZRT_TARGET_AVX2 inline __m128i pack16(__m256i x) {
  return _mm_packus_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
}

ZRT_TARGET_AVX2 inline void store16x8(void* out, std::int64_t i, __m128i h, bool stream) {
  __m128i* dst = reinterpret_cast<__m128i*>(static_cast<std::uint16_t*>(out) + i);
  if (stream) {
    _mm_stream_si128(dst, h);
  } else {
    _mm_storeu_si128(dst, h);
  }
}

template <OutKind O, bool kStream>
ZRT_TARGET_AVX2 inline void store_out8(void* out, std::int64_t i, __m256 p) {
  if constexpr (O == OutKind::kF32) {
    if constexpr (kStream) {
      _mm256_stream_ps(static_cast<float*>(out) + i, p);
    } else {
      _mm256_storeu_ps(static_cast<float*>(out) + i, p);
    }
  } else if constexpr (O == OutKind::kBF16) {
    // to_bf16: round to nearest even on the bits; NaN -> quiet NaN of the same sign.
    const __m256i u = _mm256_castps_si256(p);
    const __m256i high = _mm256_srli_epi32(u, 16);
    const __m256i lsb = _mm256_and_si256(high, _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
    const __m256i quiet = _mm256_or_si256(high, _mm256_set1_epi32(0x0040));
    r = _mm256_blendv_epi8(r, quiet, nan_lanes8(u));
    store16x8(out, i, pack16(r), kStream);
  } else if constexpr (O == OutKind::kF16) {
    __m128i h = _mm256_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT);
    const __m256i u = _mm256_castps_si256(p);
    const __m256i nan = nan_lanes8(u);
    if (!_mm256_testz_si256(nan, nan)) {  // to_fp16 writes NaN as sign | 0x7e00
      const __m256i quiet =
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x8000)),
                          _mm256_set1_epi32(0x7e00));
      const __m128i nan16 =
          _mm_packs_epi32(_mm256_castsi256_si128(nan), _mm256_extracti128_si256(nan, 1));
      h = _mm_blendv_epi8(h, pack16(quiet), nan16);
    }
    store16x8(out, i, h, kStream);
  }
}

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

// ---- AVX-512F: 16 lanes ----------------------------------------------------------------------

template <DType G>
ZRT_TARGET_AVX512 inline __m512 load_grad16(const void* grad, std::int64_t i) {
  if constexpr (G == DType::kFloat32) {
    return _mm512_loadu_ps(static_cast<const float*>(grad) + i);
  } else {
    const __m256i h = _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(static_cast<const std::uint16_t*>(grad) + i));
    if constexpr (G == DType::kBFloat16) {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    } else {
      return _mm512_cvtph_ps(h);  // exact
    }
  }
}

ZRT_TARGET_AVX512 inline __mmask16 nan_lanes16(__m512i u) {
  const __m512i abs = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
  return _mm512_cmpgt_epu32_mask(abs, _mm512_set1_epi32(0x7f800000));
}

ZRT_TARGET_AVX512 inline void store16x16(void* out, std::int64_t i, __m256i h, bool stream) {
  __m256i* dst = reinterpret_cast<__m256i*>(static_cast<std::uint16_t*>(out) + i);
  if (stream) {
    _mm256_stream_si256(dst, h);
  } else {
    _mm256_storeu_si256(dst, h);
  }
}

template <OutKind O, bool kStream>
ZRT_TARGET_AVX512 inline void store_out16(void* out, std::int64_t i, __m512 p) {
  if constexpr (O == OutKind::kF32) {
    if constexpr (kStream) {
      _mm512_stream_ps(static_cast<float*>(out) + i, p);
    } else {
      _mm512_storeu_ps(static_cast<float*>(out) + i, p);
    }
  } else if constexpr (O == OutKind::kBF16) {
    // Integer rounding rather than VCVTNEPS2BF16, which flushes subnormals to zero.
    const __m512i u = _mm512_castps_si512(p);
    const __m512i high = _mm512_srli_epi32(u, 16);
    const __m512i lsb = _mm512_and_si512(high, _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
    const __m512i quiet = _mm512_or_si512(high, _mm512_set1_epi32(0x0040));
    r = _mm512_mask_mov_epi32(r, nan_lanes16(u), quiet);
    store16x16(out, i, _mm512_cvtepi32_epi16(r), kStream);
  } else if constexpr (O == OutKind::kF16) {
    __m256i h = _mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512i u = _mm512_castps_si512(p);
    const __mmask16 nan = nan_lanes16(u);
    if (nan != 0) {  // to_fp16 writes NaN as sign | 0x7e00
      const __m512i quiet =
          _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x8000)),
                          _mm512_set1_epi32(0x7e00));
      h = _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(_mm512_cvtepu16_epi32(h), nan, quiet));
    }
    store16x16(out, i, h, kStream);
  }
}

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
