// CUDA twin of kernels/cpu/matmul.h (Conv1D matmul + bias). Forward: one cuBLASLt matmul with
// the bias epilogue where cuBLASLt has an algorithm for the shapes and alignments, else
// cublasGemmEx plus a bias kernel. Backward: cublasGemmEx accumulating (beta = 1) into dinp
// (beta = 0 with GradWrite::kOverwrite: dinp is neither zeroed first nor read) and dweight, and a
// deterministic two-pass column sum for dbias.
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/gemm.cuh"
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

// The weight gradient `dw` (a gemm_lt call with c = dweight; its epilogue kBiasGradFromA or
// kBiasGradFromB names the operand that is dout) accumulated into dweight (beta 1, c of
// grad_dtype), and dbias (OC) += dout's (N, OC) column sums. With fp32 gradients cuBLASLt's
// bias-gradient epilogue takes the sums from the GEMM's own read of dout into the fp32 scratch
// l.ws and one small kernel adds them, as bias_backward's last kernel does: dout is not read a
// second time. With 16-bit gradients (the epilogue would round the sum to 16 bits before the
// add), no dbias, or cuBLASLt declining: the plain GEMM and bias_backward. ws: as bias_backward.
// A null dweight (dw.c; a weight that is not trained) skips the GEMM: bias_backward alone.
void weight_and_bias_backward(const Launch& l, DType dtype, DType grad_dtype, LtGemm dw,
                              void* dbias, const void* dout, int N, int OC);

}  // namespace zrt::kernels::cuda
