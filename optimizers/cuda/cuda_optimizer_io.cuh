// Gradient loads and compute-dtype stores shared by the fused optimizer kernels (cuda_adam.cu,
// cuda_lion.cu): bf16/fp16 gradients widened exactly, and the copy-out rounded as dtype.h's
// to_bf16 / to_fp16 round (nearest even; NaN as there), so the kernels' copies equal the CPU
// optimizers' bit for bit. Include only from .cu files; each gets its own copies.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace zrt::detail {
namespace {

template <int G>  // 0 fp32, 1 bf16, 2 fp16
__device__ __forceinline__ float load_grad(const void* grad, std::int64_t i) {
  if constexpr (G == 0) {
    return static_cast<const float*>(grad)[i];
  } else if constexpr (G == 1) {
    return __uint_as_float(static_cast<std::uint32_t>(static_cast<const unsigned short*>(grad)[i])
                           << 16);
  } else {
    return __half2float(__ushort_as_half(static_cast<const unsigned short*>(grad)[i]));  // exact
  }
}

// The same roundings as dtype.h's to_bf16 / to_fp16 (nearest even; NaN as there).
__device__ __forceinline__ unsigned short float_to_bf16_bits(float f) {
  const std::uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<unsigned short>((u >> 16) | 0x0040u);
  return static_cast<unsigned short>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

__device__ __forceinline__ unsigned short float_to_fp16_bits(float f) {
  const std::uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<unsigned short>(((u >> 16) & 0x8000u) | 0x7e00u);
  }
  return __half_as_ushort(__float2half_rn(f));
}

template <int O>  // 0 none, 1 fp32, 2 bf16, 3 fp16
__device__ __forceinline__ void store_out(void* out, std::int64_t i, float p) {
  if constexpr (O == 1) {
    static_cast<float*>(out)[i] = p;
  } else if constexpr (O == 2) {
    static_cast<unsigned short*>(out)[i] = float_to_bf16_bits(p);
  } else if constexpr (O == 3) {
    static_cast<unsigned short*>(out)[i] = float_to_fp16_bits(p);
  }
}

}  // namespace
}  // namespace zrt::detail
