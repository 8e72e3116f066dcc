// Gradient loads and compute-dtype stores of the fused optimizer kernel
// (cuda_optimizer_kernels.cu): bf16/fp16 gradients widened exactly, and the copy-out rounded as
// dtype.h's to_bf16 / to_fp16 round (runtime/device/cuda_float16.cuh's raw-bit family: nearest
// even, NaN as there), so the kernels' copies equal the CPU optimizers' bit for bit. Include only
// from .cu files; each gets its own copies.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "runtime/device/cuda_float16.cuh"

namespace zrt::detail {
namespace {

template <int G>  // 0 fp32, 1 bf16, 2 fp16
__device__ __forceinline__ float load_grad(const void* grad, std::int64_t i) {
  if constexpr (G == 0) {
    return static_cast<const float*>(grad)[i];
  } else if constexpr (G == 1) {
    return cuda_float16::bf16_bits_to_float(static_cast<const std::uint16_t*>(grad)[i]);
  } else {
    return cuda_float16::fp16_bits_to_float(static_cast<const std::uint16_t*>(grad)[i]);
  }
}

template <int O>  // 0 none, 1 fp32, 2 bf16, 3 fp16
__device__ __forceinline__ void store_out(void* out, std::int64_t i, float p) {
  if constexpr (O == 1) {
    static_cast<float*>(out)[i] = p;
  } else if constexpr (O == 2) {
    static_cast<std::uint16_t*>(out)[i] = cuda_float16::float_to_bf16_bits(p);
  } else if constexpr (O == 3) {
    static_cast<std::uint16_t*>(out)[i] = cuda_float16::float_to_fp16_bits(p);
  }
}

}  // namespace
}  // namespace zrt::detail
