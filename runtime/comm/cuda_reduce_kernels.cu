#include "runtime/comm/cuda_reduce_kernels.h"

#include <algorithm>
#include <cstdint>

#include "runtime/comm/cuda_storage_formats.cuh"
#include "runtime/common/error.h"
#include "runtime/device/cuda_device.h"

namespace zrt {

namespace {

constexpr int kThreads = 256;
constexpr std::int64_t kMaxGrid = 8192;  // grid-stride beyond this (enough to fill any GPU)

using cuda_formats::Bf16;
using cuda_formats::F32;
using cuda_formats::first_index;
using cuda_formats::Fp16;
using cuda_formats::grid_stride;

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
