// CUDA twin of kernels/cpu/layernorm.h. Row statistics by warp reductions; the parameter
// gradients as deterministic two-pass column sums (fixed row chunks, then chunks in order).
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"

namespace zrt::kernels::cuda {

// 16-bit rows with C % 8 == 0 and C <= 4096 (16-byte aligned) take a register-resident kernel
// forward; the backward's input gradient one where C = 256 k <= 2048.
void layernorm_forward(const Launch& l, DType dtype, void* out, float* mean, float* rstd,
                       const void* inp, const void* weight, const void* bias, int N, int C);

// res (N,C) = a + b (as residual_forward), then out, mean, rstd = layernorm(res): in one pass
// over the rows where layernorm_forward takes its register-resident kernel, else the two ops.
void residual_layernorm_forward(const Launch& l, DType dtype, void* res, void* out, float* mean,
                                float* rstd, const void* a, const void* b, const void* weight,
                                const void* bias, int N, int C);

std::int64_t layernorm_backward_workspace(int N, int C);
void layernorm_backward(const Launch& l, DType dtype, DType grad_dtype, void* dinp, void* dweight,
                        void* dbias, const void* dout, const void* inp, const void* weight,
                        const float* mean, const float* rstd, int N, int C);

// Rows summed per chunk by the two-pass column sums (layernorm and bias gradients).
constexpr int kColumnSumRows = 64;
// The column sums' chunks run along gridDim.y, which CUDA caps at 65535: past that many chunks
// (4,194,240 rows: Qwen3-8B's per-head q norm at 128K tokens is 4,194,304) each block strides
// over the chunks by gridDim.y.
constexpr int kMaxColumnChunkBlocks = 65535;
inline unsigned column_chunk_blocks(int chunks) {
  return static_cast<unsigned>(chunks < kMaxColumnChunkBlocks ? chunks : kMaxColumnChunkBlocks);
}

}  // namespace zrt::kernels::cuda
