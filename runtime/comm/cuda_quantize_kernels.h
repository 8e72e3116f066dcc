// CUDA twins of the int8 block quantization kernels (quantize.h): the same arguments with device
// pointers, enqueued on `stream` (asynchronous; each launch is checked), bit-identical results
// (every step is one correctly rounded fp32 operation, no FMA, rint ties to even).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "runtime/common/dtype.h"

namespace zrt {

void cuda_quantize_int8_blocks(const void* in, DType dtype, std::int64_t n, std::int64_t block,
                               std::int8_t* q, float* scales, cudaStream_t stream);
void cuda_dequantize_int8_blocks(const std::int8_t* q, const float* scales, std::int64_t n,
                                 std::int64_t block, DType dtype, void* out, cudaStream_t stream);
void cuda_dequantize_int8_blocks_add(const std::int8_t* q, const float* scales, std::int64_t n,
                                     std::int64_t block, float* acc, bool add, cudaStream_t stream);
void cuda_narrow_fp32(const float* acc, std::int64_t n, float divisor, DType dtype, void* out,
                      cudaStream_t stream);

}  // namespace zrt
