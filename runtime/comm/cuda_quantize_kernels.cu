#include "runtime/comm/cuda_quantize_kernels.h"

#include <algorithm>
#include <cstdint>

#include "runtime/comm/cuda_storage_formats.cuh"
#include "runtime/comm/quantize.h"
#include "runtime/common/error.h"
#include "runtime/device/cuda_device.h"

namespace zrt {

namespace {

constexpr int kThreads = 256;
constexpr std::int64_t kMaxGrid = 8192;  // grid-stride beyond this

using cuda_formats::Bf16;
using cuda_formats::F32;
using cuda_formats::first_index;
using cuda_formats::Fp16;
using cuda_formats::grid_stride;

// One thread block per quantization block (grid-stride over blocks): the block's max |x| as
// the integer max of the absolute values' bits (as the CPU kernel), then the codes.
template <typename Format>
__global__ void quantize_kernel(const typename Format::T* in, std::int64_t n, std::int64_t block,
                                std::int8_t* q, float* scales) {
  __shared__ std::uint32_t partial[kThreads];
  const std::int64_t blocks = (n + block - 1) / block;
  for (std::int64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const std::int64_t first = b * block;
    const std::int64_t len = min(block, n - first);
    std::uint32_t m = 0;
    for (std::int64_t i = threadIdx.x; i < len; i += blockDim.x) {
      m = max(m, __float_as_uint(Format::widen(in[first + i])) & 0x7fffffffu);
    }
    partial[threadIdx.x] = m;
    __syncthreads();
    for (int half = blockDim.x / 2; half > 0; half /= 2) {
      if (threadIdx.x < half) {
        partial[threadIdx.x] = max(partial[threadIdx.x], partial[threadIdx.x + half]);
      }
      __syncthreads();
    }
    const std::uint32_t amax = partial[0];
    __syncthreads();  // partial is reused by the next block of the grid-stride loop
    const float s = amax >= 0x7f800000u ? __uint_as_float(0x7fc00000u)
                                        : __fdiv_rn(__uint_as_float(amax), 127.0f);
    if (threadIdx.x == 0) scales[b] = s;
    const bool zero = !(s > 0.0f);
    for (std::int64_t i = threadIdx.x; i < len; i += blockDim.x) {
      float r = 0.0f;
      if (!zero) {
        r = rintf(__fdiv_rn(Format::widen(in[first + i]), s));
        r = fminf(fmaxf(r, -127.0f), 127.0f);
      }
      q[first + i] = static_cast<std::int8_t>(static_cast<int>(r));
    }
  }
}

template <typename Format>
__global__ void dequantize_kernel(const std::int8_t* q, const float* scales, std::int64_t n,
                                  std::int64_t block, typename Format::T* out) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) {
    out[i] = Format::narrow(__fmul_rn(static_cast<float>(q[i]), scales[i / block]));
  }
}

__global__ void dequantize_add_kernel(const std::int8_t* q, const float* scales, std::int64_t n,
                                      std::int64_t block, float* acc, bool add) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) {
    const float v = __fmul_rn(static_cast<float>(q[i]), scales[i / block]);
    acc[i] = add ? __fadd_rn(acc[i], v) : v;
  }
}

template <typename Format>
__global__ void narrow_kernel(const float* acc, std::int64_t n, float divisor,
                              typename Format::T* out) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) {
    out[i] = Format::narrow(divisor != 1.0f ? __fdiv_rn(acc[i], divisor) : acc[i]);
  }
}

unsigned grid_for(std::int64_t items, std::int64_t per_block) {
  return static_cast<unsigned>(
      std::max<std::int64_t>(1, std::min(kMaxGrid, (items + per_block - 1) / per_block)));
}

}  // namespace

void cuda_quantize_int8_blocks(const void* in, DType dtype, std::int64_t n, std::int64_t block,
                               std::int8_t* q, float* scales, cudaStream_t stream) {
  check_quantize_args(dtype, n, block);
  if (n == 0) return;
  const unsigned grid = grid_for(quantized_block_count(n, block), 1);
  switch (dtype) {
    case DType::kFloat32:
      quantize_kernel<F32>
          <<<grid, kThreads, 0, stream>>>(static_cast<const float*>(in), n, block, q, scales);
      break;
    case DType::kBFloat16:
      quantize_kernel<Bf16><<<grid, kThreads, 0, stream>>>(static_cast<const std::uint16_t*>(in), n,
                                                           block, q, scales);
      break;
    default:
      quantize_kernel<Fp16><<<grid, kThreads, 0, stream>>>(static_cast<const std::uint16_t*>(in), n,
                                                           block, q, scales);
      break;
  }
  ZRT_CUDA_CHECK(cudaGetLastError());
}

void cuda_dequantize_int8_blocks(const std::int8_t* q, const float* scales, std::int64_t n,
                                 std::int64_t block, DType dtype, void* out, cudaStream_t stream) {
  check_quantize_args(dtype, n, block);
  if (n == 0) return;
  const unsigned grid = grid_for(n, kThreads);
  switch (dtype) {
    case DType::kFloat32:
      dequantize_kernel<F32>
          <<<grid, kThreads, 0, stream>>>(q, scales, n, block, static_cast<float*>(out));
      break;
    case DType::kBFloat16:
      dequantize_kernel<Bf16>
          <<<grid, kThreads, 0, stream>>>(q, scales, n, block, static_cast<std::uint16_t*>(out));
      break;
    default:
      dequantize_kernel<Fp16>
          <<<grid, kThreads, 0, stream>>>(q, scales, n, block, static_cast<std::uint16_t*>(out));
      break;
  }
  ZRT_CUDA_CHECK(cudaGetLastError());
}

void cuda_dequantize_int8_blocks_add(const std::int8_t* q, const float* scales, std::int64_t n,
                                     std::int64_t block, float* acc, bool add,
                                     cudaStream_t stream) {
  check_quantize_args(DType::kFloat32, n, block);
  if (n == 0) return;
  dequantize_add_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(q, scales, n, block, acc,
                                                                        add);
  ZRT_CUDA_CHECK(cudaGetLastError());
}

void cuda_narrow_fp32(const float* acc, std::int64_t n, float divisor, DType dtype, void* out,
                      cudaStream_t stream) {
  check_quantize_args(dtype, n, 1);
  if (n == 0) return;
  const unsigned grid = grid_for(n, kThreads);
  switch (dtype) {
    case DType::kFloat32:
      narrow_kernel<F32><<<grid, kThreads, 0, stream>>>(acc, n, divisor, static_cast<float*>(out));
      break;
    case DType::kBFloat16:
      narrow_kernel<Bf16>
          <<<grid, kThreads, 0, stream>>>(acc, n, divisor, static_cast<std::uint16_t*>(out));
      break;
    default:
      narrow_kernel<Fp16>
          <<<grid, kThreads, 0, stream>>>(acc, n, divisor, static_cast<std::uint16_t*>(out));
      break;
  }
  ZRT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zrt
