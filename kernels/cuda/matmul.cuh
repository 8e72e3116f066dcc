// CUDA twin of kernels/cpu/matmul.h (Conv1D matmul + bias). Forward: one cuBLASLt matmul with
// the bias epilogue where cuBLASLt has an algorithm for the shapes and alignments, else
// cublasGemmEx plus a bias kernel. Backward: cublasGemmEx accumulating (beta = 1) into dinp
// (beta = 0 with GradWrite::kOverwrite: dinp is neither zeroed first nor read) and dweight, and a
// deterministic two-pass column sum for dbias.
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/grad_write.h"

namespace zrt::kernels::cuda {

void matmul_forward(const Launch& l, DType dtype, void* out, const void* inp, const void* weight,
                    const void* bias, int N, int C, int OC);

std::int64_t matmul_backward_workspace(int N, int OC);
void matmul_backward(const Launch& l, DType dtype, DType grad_dtype, void* dinp, void* dweight,
                     void* dbias, const void* dout, const void* inp, const void* weight, int N,
                     int C, int OC, GradWrite dinp_write);

// out (N,OC) += bias (OC) per row (the fallback of matmul_forward, and linear.cu's bias).
void add_bias(const Launch& l, DType dtype, void* out, const void* bias, int N, int OC);

// dbias (C) += column sums of dout (N,C), deterministic; ws holds bias_backward_workspace bytes.
std::int64_t bias_backward_workspace(int N, int C);
void bias_backward(const Launch& l, DType dtype, DType grad_dtype, void* dbias, const void* dout,
                   int N, int C, void* ws);

}  // namespace zrt::kernels::cuda
