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

// A cuBLASLt matmul with a fused epilogue, row-major like gemm():
//   c (m x n, ldc) = epilogue(op(a) (m x k) @ op(b) (k x n) [+ bias (n)]) [+ beta * c],
// a and b of `type`, c of `c_type` (`type` or fp32), fp32 accumulation and the epilogue applied
// before the single rounding to `c_type`.
//   kBias:           + bias.
//   kGeluAuxBias:    pre = ... + bias is stored to aux (m x n, row stride aux_ld) and c = gelu(pre)
//                    (cuBLASLt's GELU is GPT-2's tanh approximation).
//   kDGelu:          c = gelu'(aux) * (op(a) @ op(b)): the GELU's input gradient, aux holding the
//                    GELU's input (m x n, row stride aux_ld).
//   kBiasGradFromA:  also bias_grad (m) = op(a) summed over k (cuBLASLt's BGRADB: a is its B,
//                    which it requires transposed, so trans_a).
//   kBiasGradFromB:  also bias_grad (n) = op(b) summed over k (cuBLASLt's BGRADA: b is its A,
//                    which it requires untransposed, so !trans_b).
// The bias gradients are the unscaled sums (alpha and beta do not touch them), OVERWRITE
// bias_grad and are of c_type (cuBLASLt's default bias type: the output's); the weight-gradient
// GEMMs take them with c_type fp32 and add them to the bias gradient themselves.
// beta is 0 for the bias and GELU epilogues. aux_ld must be a multiple of 8 and at least n
// (cuBLASLt's rule). Returns false (and does nothing) when cuBLASLt offers no algorithm for
// these shapes, alignments and epilogue; the caller then runs the unfused kernels.
enum class LtEpilogue { kBias, kGeluAuxBias, kDGelu, kBiasGradFromA, kBiasGradFromB };
constexpr int kLtEpilogues = 5;
// cuBLASLt's name of the epilogue (its CUBLASLT_EPILOGUE_ suffix).
const char* lt_epilogue_name(LtEpilogue e);
struct LtGemm {
  LtEpilogue epilogue = LtEpilogue::kBias;
  bool trans_a = false, trans_b = false;
  int m = 0, n = 0, k = 0;
  const void* a = nullptr;
  int lda = 0;
  const void* b = nullptr;
  int ldb = 0;
  void* c = nullptr;
  int ldc = 0;
  cudaDataType type = CUDA_R_32F;    // a and b
  cudaDataType c_type = CUDA_R_32F;  // c (lt_gemm sets it to `type`)
  float beta = 0.0f;
  const void* bias = nullptr;  // kBias, kGeluAuxBias
  void* aux = nullptr;         // kGeluAuxBias (written), kDGelu (read)
  int aux_ld = 0;
  void* bias_grad = nullptr;  // kBiasGradFromA / kBiasGradFromB (written)
};
bool gemm_lt(const Launch& l, const LtGemm& g);
// The operands of a row-major c (m x n) = op(a) (m x k) @ op(b) (k x n) of one type, beta 0,
// no epilogue fields set.
LtGemm lt_gemm(bool trans_a, bool trans_b, int m, int n, int k, const void* a, int lda,
               const void* b, int ldb, void* c, int ldc, cudaDataType type);

// c (m x n) = a (m x k) @ b (k x n) + bias (n): gemm_lt with the bias epilogue.
bool gemm_bias_lt(const Launch& l, int m, int n, int k, const void* a, int lda, const void* b,
                  int ldb, const void* bias, void* c, int ldc, cudaDataType type);

}  // namespace zrt::kernels::cuda
