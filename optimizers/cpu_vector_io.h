// Loads, stores and memory helpers shared by the CPU optimizers' per-ISA kernels
// (cpu_adam_kernels.cc, cpu_lion_kernels.cc): gradient loads widening bf16/fp16 exactly, the
// compute-dtype copy's stores rounding to nearest even as to_bf16/to_fp16 do (NaN as their
// quiet NaN), software prefetch and the non-temporal store start. Include only from files built
// with the same flags as those (-ffp-contract=off); every function is inline and file-local in
// effect (an unnamed namespace per including file).
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "runtime/common/dtype.h"

#define ZRT_TARGET_AVX2 __attribute__((target("avx2,f16c")))
#define ZRT_TARGET_AVX512 __attribute__((target("avx512f")))

namespace zrt::detail {
namespace {  // each kernel file gets its own copies

constexpr std::int64_t kPrefetch = 512;  // elements ahead (2 KiB of fp32)
// Range length from which the copy streams: below one chunk of the thread split
// (cpu_slice_step.h), so that the chunks of a large step stream too.
constexpr std::int64_t kStreamMin = 1 << 14;

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

template <typename Slice>
inline OutKind out_kind(const Slice& slice) {
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

}  // namespace
}  // namespace zrt::detail
