#include "kernels/cuda/gemm.cuh"

#include <cstdint>

#include <spdlog/spdlog.h>

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

namespace {
template <typename T>
void set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value) {
  ZRT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof value));
}
template <typename T>
void set_pref(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr,
              const T& value) {
  ZRT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof value));
}

}  // namespace

const char* lt_epilogue_name(LtEpilogue e) {
  switch (e) {
    case LtEpilogue::kBias:
      return "BIAS";
    case LtEpilogue::kGeluAuxBias:
      return "GELU_AUX_BIAS";
    case LtEpilogue::kDGelu:
      return "DGELU";
    case LtEpilogue::kBiasGradFromA:
      return "BGRADB";
    case LtEpilogue::kBiasGradFromB:
      return "BGRADA";
  }
  return "?";
}

bool gemm_lt(const Launch& l, const LtGemm& g) {
  if (l.lt == nullptr || g.m <= 0 || g.n <= 0) return false;
  const unsigned epilogue_bit = 1u << static_cast<unsigned>(g.epilogue);
  // A shape the epilogue cannot take: the caller's unfused kernels run, which the run's log
  // reports (describe_fused_paths).
  const auto decline = [&] {
    if (l.state != nullptr) l.state->lt_declined_epilogues |= epilogue_bit;
    return false;
  };
  const bool with_aux = g.epilogue == LtEpilogue::kGeluAuxBias || g.epilogue == LtEpilogue::kDGelu;
  const bool bias_grad =
      g.epilogue == LtEpilogue::kBiasGradFromA || g.epilogue == LtEpilogue::kBiasGradFromB;
  if (with_aux && (g.aux == nullptr || g.aux_ld % 8 != 0 || g.aux_ld < g.n)) return decline();
  // cuBLASLt's bias-gradient epilogues want its A untransposed (BGRADA) or its B transposed
  // (BGRADB); its A is our b and its B our a (below).
  if (bias_grad && (g.bias_grad == nullptr || g.k <= 0)) return decline();
  if (g.epilogue == LtEpilogue::kBiasGradFromB && g.trans_b) return decline();
  if (g.epilogue == LtEpilogue::kBiasGradFromA && !g.trans_a) return decline();
  if (l.state != nullptr && (l.state->lt_refused_epilogues & epilogue_bit) != 0) return false;
  // Column-major, as gemm(): D (n x m, ld ldc) = op(B_cm) op(A_cm) with B_cm = b, A_cm = a, so
  // cuBLASLt's A is our b and its B our a; D's rows are our columns, which is where the bias
  // and the aux matrix's leading dimension run.
  LtDescs d;
  ZRT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t lt_a_op = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t lt_b_op = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  set_desc(d.op, CUBLASLT_MATMUL_DESC_TRANSA, lt_a_op);
  set_desc(d.op, CUBLASLT_MATMUL_DESC_TRANSB, lt_b_op);
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
  if (g.epilogue == LtEpilogue::kGeluAuxBias) epilogue = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  if (g.epilogue == LtEpilogue::kDGelu) epilogue = CUBLASLT_EPILOGUE_DGELU;
  if (g.epilogue == LtEpilogue::kBiasGradFromA) epilogue = CUBLASLT_EPILOGUE_BGRADB;
  if (g.epilogue == LtEpilogue::kBiasGradFromB) epilogue = CUBLASLT_EPILOGUE_BGRADA;
  set_desc(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue);
  // The pointer is set before the heuristic query, which reads its alignment from it.
  if (bias_grad) {
    set_desc(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias_grad);
  } else if (g.epilogue != LtEpilogue::kDGelu) {
    set_desc(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias);
  }
  if (with_aux) {
    set_desc(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, g.aux);
    set_desc(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, static_cast<std::int64_t>(g.aux_ld));
  }
  // Stored shapes (column-major rows x cols): A_cm is b as stored, B_cm is a as stored.
  const int a_rows = g.trans_b ? g.k : g.n, a_cols = g.trans_b ? g.n : g.k;
  const int b_rows = g.trans_a ? g.m : g.k, b_cols = g.trans_a ? g.k : g.m;
  ZRT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.a, g.type, a_rows, a_cols, g.ldb));
  ZRT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.b, g.type, b_rows, b_cols, g.lda));
  ZRT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.c, g.c_type, g.n, g.m, g.ldc));
  ZRT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&d.pref));
  set_pref(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
           static_cast<std::uint64_t>(l.lt_workspace_bytes));
  set_pref(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment_of(g.b));
  set_pref(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment_of(g.a));
  set_pref(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment_of(g.c));
  set_pref(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment_of(g.c));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(l.lt, d.op, d.a, d.b, d.c, d.c, d.pref, 1, &result, &found);
  // No algorithm for these shapes, alignments and epilogue: not an error, the caller's unfused
  // kernels compute the same.
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || (status == CUBLAS_STATUS_SUCCESS && found == 0)) {
    return decline();
  }
  const float alpha = 1.0f;
  const auto matmul = [&] {
    return cublasLtMatmul(l.lt, d.op, &alpha, g.b, d.a, g.a, d.b, &g.beta, g.c, d.c, g.c, d.c,
                          &result.algo, l.lt_workspace, l.lt_workspace_bytes, l.stream);
  };
  if (g.epilogue == LtEpilogue::kBias) {
    if (found == 0) return decline();  // as before the GELU epilogues: proven so on an H100
    ZRT_CUBLAS_CHECK(status);
    ZRT_CUBLAS_CHECK(matmul());
    if (l.state != nullptr) l.state->lt_fused_epilogues |= epilogue_bit;
    return true;
  }
  // The GELU and bias-gradient epilogues have run only where the stand-ins model them until a
  // GPU proves them: if this cuBLASLt fails one with an error (not a declined shape), say so
  // once and leave it to the unfused kernels rather than end the run. A failed call has
  // written nothing.
  cublasStatus_t failed = status;
  if (status == CUBLAS_STATUS_SUCCESS) failed = matmul();
  if (failed == CUBLAS_STATUS_SUCCESS) {
    if (l.state != nullptr) l.state->lt_fused_epilogues |= epilogue_bit;
    return true;
  }
  if (l.state != nullptr) l.state->lt_refused_epilogues |= epilogue_bit;
  spdlog::warn(
      "cuBLASLt epilogue {} failed for a {} x {} x {} GEMM ({}, cuBLAS status {}); the unfused "
      "kernels run instead for the rest of the run",
      lt_epilogue_name(g.epilogue), g.m, g.n, g.k, cublasGetStatusString(failed),
      static_cast<int>(failed));
  return false;
}

LtGemm lt_gemm(bool trans_a, bool trans_b, int m, int n, int k, const void* a, int lda,
               const void* b, int ldb, void* c, int ldc, cudaDataType type) {
  LtGemm g;
  g.trans_a = trans_a;
  g.trans_b = trans_b;
  g.m = m;
  g.n = n;
  g.k = k;
  g.a = a;
  g.lda = lda;
  g.b = b;
  g.ldb = ldb;
  g.c = c;
  g.ldc = ldc;
  g.type = type;
  g.c_type = type;
  return g;
}

bool gemm_bias_lt(const Launch& l, int m, int n, int k, const void* a, int lda, const void* b,
                  int ldb, const void* bias, void* c, int ldc, cudaDataType type) {
  LtGemm g = lt_gemm(false, false, m, n, k, a, lda, b, ldb, c, ldc, type);
  g.bias = bias;
  return gemm_lt(l, g);
}

}  // namespace zrt::kernels::cuda
