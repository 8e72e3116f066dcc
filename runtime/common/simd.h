// ZRT_SIMD_CLONES: compile a loop for AVX-512, AVX2 and baseline x86-64 and pick one at load
// time (GCC function multiversioning), so one binary runs on any x86-64 at full width.
//
// Sanitizer builds get a single baseline version: the ifunc resolvers that multiversioning
// emits run before the sanitizer runtime is initialised and crash under TSan/ASan.
#pragma once

#if defined(__x86_64__) && !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__) && \
    !defined(__clang__)
#define ZRT_SIMD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define ZRT_SIMD_CLONES
#endif
