// CUDA twin of kernels/cpu/rmsnorm.h. Row statistics by warp reductions (one warp per row); the
// weight gradient as a deterministic two-pass column sum (fixed row chunks, then chunks in
// order), as layernorm.cu.
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"

namespace zrt::kernels::cuda {

void rmsnorm_forward(const Launch& l, DType dtype, void* out, float* rstd, const void* inp,
                     const void* weight, int N, int C, double eps);

// res (N,C) = a + b, then out, rstd = rmsnorm(res): residual_forward and rmsnorm_forward, in one
// pass over each row where the row fits the vector kernel (16-bit, C % 8 == 0, C <= 4096).
void residual_rmsnorm_forward(const Launch& l, DType dtype, void* res, void* out, float* rstd,
                              const void* a, const void* b, const void* weight, int N, int C,
                              double eps);

std::int64_t rmsnorm_backward_workspace(int N, int C);
void rmsnorm_backward(const Launch& l, DType dtype, DType grad_dtype, void* dinp, void* dweight,
                      const void* dout, const void* inp, const void* weight, const float* rstd,
                      int N, int C);

}  // namespace zrt::kernels::cuda
