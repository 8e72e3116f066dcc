// fp32 <-> bf16 / fp16 in device code (nvcc only): the one place the .cu files take their 16-bit
// float conversions from. Every narrowing rounds to nearest, ties to even; every widening is
// exact. Two families, which differ only in the NaN they produce:
//
//  - on CUDA's types (__nv_bfloat16, __half): the cuda_bf16.h / cuda_fp16.h intrinsics, fastest;
//    a NaN narrows to the canonical NaN. The model kernels and the engine kernels use these.
//  - on raw bits (std::uint16_t): bit for bit runtime/common/dtype.h's to_bf16 / to_fp16 on the
//    host, NaN payloads included, for results that must match the CPU backend to the bit (the
//    collectives' reductions, the optimizer's parameter copies).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace zrt::cuda_float16 {

// ---- CUDA's types, by the intrinsics -------------------------------------------------------

__device__ __forceinline__ float to_float(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
__device__ __forceinline__ float to_float(__half v) {
  return __half2float(v);
}
__device__ __forceinline__ __nv_bfloat16 to_bf16_rn(float v) {
  return __float2bfloat16_rn(v);
}
__device__ __forceinline__ __half to_fp16_rn(float v) {
  return __float2half_rn(v);
}

// ---- raw bits, as runtime/common/dtype.h ----------------------------------------------------
// Written out rather than taken from the intrinsics: those produce a canonical NaN, where
// dtype.h keeps the payload.

__device__ __forceinline__ float bf16_bits_to_float(std::uint16_t h) {
  return __uint_as_float(static_cast<std::uint32_t>(h) << 16);
}

__device__ __forceinline__ std::uint16_t float_to_bf16_bits(float f) {
  const std::uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep it quiet and NaN after truncation
    return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  }
  const std::uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);  // nearest, ties to even
  return static_cast<std::uint16_t>((u + rounding) >> 16);
}

__device__ __forceinline__ float fp16_bits_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  const std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return __uint_as_float(sign | 0x7f800000u | (mantissa << 13));
  if (exponent != 0) return __uint_as_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  if (mantissa == 0) return __uint_as_float(sign);  // signed zero
  // Subnormal: value = mantissa * 2^-24, exact in fp32.
  const float magnitude = __fmul_rn(static_cast<float>(mantissa), 5.9604644775390625e-08f);
  return sign ? -magnitude : magnitude;
}

__device__ __forceinline__ std::uint16_t float_to_fp16_bits(float f) {
  const std::uint32_t u = __float_as_uint(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520: inf
  if (abs < 0x38800000u) {
    // Result is subnormal (or zero): scale to units of 2^-24 and round to nearest even.
    if (abs < 0x33000000u) return sign;  // below half the smallest subnormal
    const std::uint32_t exponent = abs >> 23;
    const std::uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - exponent;  // 14..24
    std::uint32_t value = mantissa >> shift;
    const std::uint32_t remainder = mantissa & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1u);
    if (remainder > half || (remainder == half && (value & 1u))) ++value;
    return static_cast<std::uint16_t>(sign | value);
  }
  // Normal: rebias exponent (127 -> 15) and round the 13 dropped mantissa bits to nearest even.
  const std::uint32_t rebased = abs - (112u << 23);
  const std::uint32_t rounded = rebased + 0xfffu + ((rebased >> 13) & 1u);
  return static_cast<std::uint16_t>(sign | (rounded >> 13));
}

}  // namespace zrt::cuda_float16
