// CUDA twin of kernels/cpu/linear.h (nn.Linear layout, weight (OC, C)). Forward: cublasGemmEx
// with the weight transposed, plus matmul.cu's bias kernel; backward: cublasGemmEx accumulating
// (beta = 1; dinp beta = 0 with GradWrite::kOverwrite) into dinp and dweight, and matmul.cu's
// deterministic column sum for dbias.
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/grad_write.h"

namespace zrt::kernels::cuda {

void linear_forward(const Launch& l, DType dtype, void* out, const void* inp, const void* weight,
                    const void* bias, int N, int C, int OC);

std::int64_t linear_backward_workspace(int N, int OC);
void linear_backward(const Launch& l, DType dtype, DType grad_dtype, void* dinp, void* dweight,
                     void* dbias, const void* dout, const void* inp, const void* weight, int N,
                     int C, int OC, GradWrite dinp_write);

}  // namespace zrt::kernels::cuda
