#include "kernels/cuda/gemm.cuh"

#include <cstdint>

#include "runtime/common/error.h"

namespace zrt::kernels::cuda {

namespace {

cublasOperation_t op(bool trans) {
  return trans ? CUBLAS_OP_T : CUBLAS_OP_N;
}

// Largest power of two (<= 256) dividing the address: what cuBLASLt may assume about it.
std::uint32_t alignment_of(const void* p) {
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t align = 256;
  while (align > 1 && address % align != 0) align /= 2;
  return align;
}

// RAII holders for the cuBLASLt descriptors of one call.
struct LtDescs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtDescs() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

}  // namespace

// Row-major c = op(a) op(b) is column-major c^T = op(b)^T op(a)^T, and a row-major matrix is its
// transpose in column-major: so swap the operands and the m/n dimensions, keep the flags.
void gemm(const Launch& l, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
          const void* a, cudaDataType a_type, int lda, const void* b, cudaDataType b_type, int ldb,
          float beta, void* c, cudaDataType c_type, int ldc) {
  if (m <= 0 || n <= 0) return;
  ZRT_CUBLAS_CHECK(cublasGemmEx(l.blas, op(trans_b), op(trans_a), n, m, k, &alpha, b, b_type, ldb,
                                a, a_type, lda, &beta, c, c_type, ldc, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT));
}

void gemm_strided_batched(const Launch& l, bool trans_a, bool trans_b, int m, int n, int k,
                          float alpha, const void* a, cudaDataType a_type, int lda,
                          long long stride_a, const void* b, cudaDataType b_type, int ldb,
                          long long stride_b, float beta, void* c, cudaDataType c_type, int ldc,
                          long long stride_c, int batch) {
  if (m <= 0 || n <= 0 || batch <= 0) return;
  ZRT_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      l.blas, op(trans_b), op(trans_a), n, m, k, &alpha, b, b_type, ldb, stride_b, a, a_type, lda,
      stride_a, &beta, c, c_type, ldc, stride_c, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

bool gemm_bias_lt(const Launch& l, int m, int n, int k, const void* a, int lda, const void* b,
                  int ldb, const void* bias, void* c, int ldc, cudaDataType type) {
  if (l.lt == nullptr || m <= 0 || n <= 0) return false;
  // Column-major: D (n x m, ld ldc) = B_cm (n x k, ld ldb) @ A_cm (k x m, ld lda) + bias (n),
  // the bias running along D's rows as the epilogue requires.
  LtDescs d;
  ZRT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t no_trans = CUBLAS_OP_N;
  ZRT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &no_trans,
                                                  sizeof no_trans));
  ZRT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &no_trans,
                                                  sizeof no_trans));
  const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
  ZRT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                                  sizeof epilogue));
  ZRT_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  ZRT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.a, type, n, k, ldb));
  ZRT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.b, type, k, m, lda));
  ZRT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.c, type, n, m, ldc));
  ZRT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&d.pref));
  const std::uint64_t ws_bytes = l.lt_workspace_bytes;
  ZRT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes));
  const std::uint32_t align_a = alignment_of(b), align_b = alignment_of(a),
                      align_c = alignment_of(c);
  ZRT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof align_a));
  ZRT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof align_b));
  ZRT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof align_c));
  ZRT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c, sizeof align_c));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(l.lt, d.op, d.a, d.b, d.c, d.c, d.pref, 1, &result, &found);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || found == 0) return false;
  ZRT_CUBLAS_CHECK(status);
  const float alpha = 1.0f, beta = 0.0f;
  ZRT_CUBLAS_CHECK(cublasLtMatmul(l.lt, d.op, &alpha, b, d.a, a, d.b, &beta, c, d.c, c, d.c,
                                  &result.algo, l.lt_workspace, l.lt_workspace_bytes, l.stream));
  return true;
}

}  // namespace zrt::kernels::cuda
