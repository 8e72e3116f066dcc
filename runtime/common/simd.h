// Hot CPU loops compiled for AVX-512, AVX2 and baseline x86-64 in one binary, with the path
// chosen at run time by active_cpu_isa() (so ZRT_CPU_ISA can force a narrower one; see
// cpu_isa.h). A kernel is written once as an always-inlined body; ZRT_SIMD_DISPATCH compiles
// that body under each target and defines the public function that picks one:
//
//   ZRT_SIMD_BODY void add_body(const float* a, float* b, std::int64_t n) { ... loop ... }
//   ZRT_SIMD_DISPATCH(void, add, (const float* a, float* b, std::int64_t n), (a, b, n), add_body)
//
// The three copies perform the same IEEE operations; results differ between them only where a
// loop reduces (an OpenMP SIMD reduction sums in an order set by the vector width).
//
// (GCC's target_clones did this before, but its load-time resolver cannot be steered, and it
// crashed under the sanitizers; this form has no resolver and works in every build.)
#pragma once

#include "runtime/common/cpu_isa.h"

#define ZRT_SIMD_BODY static inline __attribute__((always_inline))

#if defined(__x86_64__)
// The three compiled copies alone, name##_avx512 / _avx2 / _baseline, for a caller that picks
// the path itself (a kernel taking an explicit CpuIsa, as tests comparing the paths need).
#define ZRT_SIMD_VARIANTS(ret, name, params, args, body)               \
  __attribute__((target("avx512f"))) static ret name##_avx512 params { \
    return body args;                                                  \
  }                                                                    \
  __attribute__((target("avx2"))) static ret name##_avx2 params {      \
    return body args;                                                  \
  }                                                                    \
  static ret name##_baseline params {                                  \
    return body args;                                                  \
  }
#define ZRT_SIMD_DISPATCH(ret, name, params, args, body) \
  ZRT_SIMD_VARIANTS(ret, name, params, args, body)       \
  ret name params {                                      \
    switch (::zrt::active_cpu_isa()) {                   \
      case ::zrt::CpuIsa::kAvx512:                       \
        return name##_avx512 args;                       \
      case ::zrt::CpuIsa::kAvx2:                         \
        return name##_avx2 args;                         \
      default:                                           \
        return name##_baseline args;                     \
    }                                                    \
  }
#else
#define ZRT_SIMD_VARIANTS(ret, name, params, args, body) \
  static ret name##_avx512 params {                      \
    return body args;                                    \
  }                                                      \
  static ret name##_avx2 params {                        \
    return body args;                                    \
  }                                                      \
  static ret name##_baseline params {                    \
    return body args;                                    \
  }
#define ZRT_SIMD_DISPATCH(ret, name, params, args, body) \
  ret name params {                                      \
    return body args;                                    \
  }
#endif
