// cuBLAS GEMMs with row-major arguments, fp32 compute (the CPU twins' gemm.h conventions):
//   c (m x n) = alpha * op(a) (m x k) @ op(b) (k x n) + beta * c,
// each matrix row-major with its leading dimension. Mixed storage types are allowed where
// cublasGemmEx supports them with CUBLAS_COMPUTE_32F (16-bit a/b with 16-bit or fp32 c).
#pragma once

#include <library_types.h>

#include "kernels/cuda/cuda_common.cuh"

namespace zrt::kernels::cuda {

void gemm(const Launch& l, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
          const void* a, cudaDataType a_type, int lda, const void* b, cudaDataType b_type, int ldb,
          float beta, void* c, cudaDataType c_type, int ldc);

// `batch` independent GEMMs; matrix i of a starts at a + i*stride_a elements (same for b, c).
void gemm_strided_batched(const Launch& l, bool trans_a, bool trans_b, int m, int n, int k,
                          float alpha, const void* a, cudaDataType a_type, int lda,
                          long long stride_a, const void* b, cudaDataType b_type, int ldb,
                          long long stride_b, float beta, void* c, cudaDataType c_type, int ldc,
                          long long stride_c, int batch);

// c (m x n) = a (m x k) @ b (k x n) + bias (n), all row-major and of one type, through a
// cuBLASLt matmul with the bias epilogue (fp32 accumulation, bias added before the single
// rounding). Returns false (and does nothing) when cuBLASLt offers no algorithm for these
// shapes and alignments; the caller then falls back to gemm() and its own bias kernel.
bool gemm_bias_lt(const Launch& l, int m, int n, int k, const void* a, int lda, const void* b,
                  int ldb, const void* bias, void* c, int ldc, cudaDataType type);

}  // namespace zrt::kernels::cuda
