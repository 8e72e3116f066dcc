// Storage formats of the collectives' CUDA kernels (cuda_reduce_kernels.cu,
// cuda_quantize_kernels.cu): how each float dtype widens to and narrows from fp32, bit for bit as
// runtime/common/dtype.h (NaN payloads too), so the kernels match their CPU twins exactly; and
// the grid-stride indexing they share. nvcc only.
#pragma once

#include <cstdint>

#include "runtime/device/cuda_float16.cuh"

namespace zrt::cuda_formats {

struct F32 {
  using T = float;
  static __device__ __forceinline__ float widen(float v) { return v; }
  static __device__ __forceinline__ float narrow(float f) { return f; }
};
struct Bf16 {
  using T = std::uint16_t;
  static __device__ __forceinline__ float widen(std::uint16_t v) {
    return cuda_float16::bf16_bits_to_float(v);
  }
  static __device__ __forceinline__ std::uint16_t narrow(float f) {
    return cuda_float16::float_to_bf16_bits(f);
  }
};
struct Fp16 {
  using T = std::uint16_t;
  static __device__ __forceinline__ float widen(std::uint16_t v) {
    return cuda_float16::fp16_bits_to_float(v);
  }
  static __device__ __forceinline__ std::uint16_t narrow(float f) {
    return cuda_float16::float_to_fp16_bits(f);
  }
};

__device__ __forceinline__ std::int64_t first_index() {
  return static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::int64_t grid_stride() {
  return static_cast<std::int64_t>(gridDim.x) * blockDim.x;
}

}  // namespace zrt::cuda_formats
