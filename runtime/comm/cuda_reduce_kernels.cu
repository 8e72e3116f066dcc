#include "runtime/comm/cuda_reduce_kernels.h"

#include <algorithm>
#include <cstdint>

#include "runtime/common/error.h"
#include "runtime/device/cuda_device.h"

namespace zrt {

namespace {

constexpr int kThreads = 256;
constexpr std::int64_t kMaxGrid = 8192;  // grid-stride beyond this (enough to fill any GPU)

// ---- fp32 <-> bf16 / fp16, bit for bit as runtime/common/dtype.h ------------------------------
// Written out rather than taken from cuda_bf16.h / cuda_fp16.h: the intrinsics round the same
// way (nearest even) but produce a canonical NaN, where dtype.h keeps the payload.

__device__ __forceinline__ float bf16_to_float(std::uint16_t h) {
  return __uint_as_float(static_cast<std::uint32_t>(h) << 16);
}

__device__ __forceinline__ std::uint16_t float_to_bf16(float f) {
  const std::uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep it quiet and NaN after truncation
    return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  }
  const std::uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);  // nearest, ties to even
  return static_cast<std::uint16_t>((u + rounding) >> 16);
}

__device__ __forceinline__ float fp16_to_float(std::uint16_t h) {
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

__device__ __forceinline__ std::uint16_t float_to_fp16(float f) {
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

// Storage formats of the float kernels: how to widen to and narrow from fp32.
struct F32 {
  using T = float;
  static __device__ __forceinline__ float widen(float v) { return v; }
  static __device__ __forceinline__ float narrow(float f) { return f; }
};
struct Bf16 {
  using T = std::uint16_t;
  static __device__ __forceinline__ float widen(std::uint16_t v) { return bf16_to_float(v); }
  static __device__ __forceinline__ std::uint16_t narrow(float f) { return float_to_bf16(f); }
};
struct Fp16 {
  using T = std::uint16_t;
  static __device__ __forceinline__ float widen(std::uint16_t v) { return fp16_to_float(v); }
  static __device__ __forceinline__ std::uint16_t narrow(float f) { return float_to_fp16(f); }
};

__device__ __forceinline__ std::int64_t first_index() {
  return static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::int64_t grid_stride() {
  return static_cast<std::int64_t>(gridDim.x) * blockDim.x;
}

// One element per thread and grid-stride step; the rank loop is innermost so each element is
// summed in rank order, in fp32, with explicitly rounded operations (never contracted to FMA).
template <typename Format>
__global__ void reduce_float_kernel(const typename Format::T* blocks, std::int64_t stride,
                                    int nblocks, std::int64_t count, bool average,
                                    typename Format::T* out) {
  for (std::int64_t i = first_index(); i < count; i += grid_stride()) {
    float acc = Format::widen(blocks[i]);
    for (int r = 1; r < nblocks; ++r) acc = __fadd_rn(acc, Format::widen(blocks[r * stride + i]));
    if (average) acc = __fdiv_rn(acc, static_cast<float>(nblocks));
    out[i] = Format::narrow(acc);
  }
}

// Integer sums wrap (computed unsigned, so overflow is defined); maxima are exact.
template <typename Int, typename UInt>
__global__ void reduce_int_kernel(const Int* blocks, std::int64_t stride, int nblocks,
                                  std::int64_t count, bool maximum, Int* out) {
  for (std::int64_t i = first_index(); i < count; i += grid_stride()) {
    Int acc = blocks[i];
    for (int r = 1; r < nblocks; ++r) {
      const Int v = blocks[r * stride + i];
      acc = maximum ? (acc < v ? v : acc)
                    : static_cast<Int>(static_cast<UInt>(acc) + static_cast<UInt>(v));
    }
    out[i] = acc;
  }
}

template <typename Format>
void launch_float(const void* blocks, std::int64_t stride, int nblocks, std::int64_t count,
                  bool average, void* out, unsigned grid, cudaStream_t stream) {
  using T = typename Format::T;
  reduce_float_kernel<Format><<<grid, kThreads, 0, stream>>>(
      static_cast<const T*>(blocks), stride, nblocks, count, average, static_cast<T*>(out));
}

template <typename Int, typename UInt>
void launch_int(const void* blocks, std::int64_t stride, int nblocks, std::int64_t count,
                bool maximum, void* out, unsigned grid, cudaStream_t stream) {
  reduce_int_kernel<Int, UInt><<<grid, kThreads, 0, stream>>>(
      static_cast<const Int*>(blocks), stride, nblocks, count, maximum, static_cast<Int*>(out));
}

}  // namespace

void cuda_reduce_blocks(const void* blocks, std::int64_t stride, int nblocks, std::int64_t count,
                        DType dtype, ReduceOp op, void* out, cudaStream_t stream) {
  ZRT_CHECK(nblocks >= 1, "reduce over {} blocks", nblocks);
  ZRT_CHECK(count >= 0 && stride >= count, "reduce of {} elements with block stride {}", count,
            stride);
  if (is_floating(dtype)) {
    ZRT_CHECK(op == ReduceOp::kSum || op == ReduceOp::kAvg, "{} is not supported on {}",
              reduce_op_name(op), dtype_name(dtype));
  } else {
    ZRT_CHECK(op != ReduceOp::kAvg, "avg is not defined on {}", dtype_name(dtype));
  }
  if (count == 0) return;
  const auto grid = static_cast<unsigned>(std::min(kMaxGrid, (count + kThreads - 1) / kThreads));
  const bool average = op == ReduceOp::kAvg;
  const bool maximum = op == ReduceOp::kMax;
  switch (dtype) {
    case DType::kFloat32:
      launch_float<F32>(blocks, stride, nblocks, count, average, out, grid, stream);
      break;
    case DType::kBFloat16:
      launch_float<Bf16>(blocks, stride, nblocks, count, average, out, grid, stream);
      break;
    case DType::kFloat16:
      launch_float<Fp16>(blocks, stride, nblocks, count, average, out, grid, stream);
      break;
    case DType::kInt32:
      launch_int<std::int32_t, std::uint32_t>(blocks, stride, nblocks, count, maximum, out, grid,
                                              stream);
      break;
    case DType::kInt64:
      launch_int<std::int64_t, std::uint64_t>(blocks, stride, nblocks, count, maximum, out, grid,
                                              stream);
      break;
  }
  ZRT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zrt
