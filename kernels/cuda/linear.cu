#include "kernels/cuda/linear.cuh"

#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/matmul.cuh"

namespace zrt::kernels::cuda {

void linear_forward(const Launch& l, DType dtype, void* out, const void* inp, const void* weight,
                    const void* bias, int N, int C, int OC) {
  const cudaDataType type = to_cuda_dtype(dtype);
  gemm(l, false, true, N, OC, C, 1.0f, inp, type, C, weight, type, C, 0.0f, out, type, OC);
  if (bias != nullptr) add_bias(l, dtype, out, bias, N, OC);
}

std::int64_t linear_backward_workspace(int N, int OC) {
  return bias_backward_workspace(N, OC);
}

void linear_backward(const Launch& l, DType dtype, DType grad_dtype, void* dinp, void* dweight,
                     void* dbias, const void* dout, const void* inp, const void* weight, int N,
                     int C, int OC, GradWrite dinp_write) {
  const cudaDataType type = to_cuda_dtype(dtype);
  if (dinp != nullptr) {
    const float beta = dinp_write == GradWrite::kOverwrite ? 0.0f : 1.0f;
    gemm(l, false, false, N, C, OC, 1.0f, dout, type, OC, weight, type, C, beta, dinp, type, C);
  }
  // dweight (OC, C) += dout^T @ inp: dout is the GEMM's a.
  LtGemm dw = lt_gemm(true, false, OC, C, N, dout, OC, inp, C, dweight, C, type);
  dw.epilogue = LtEpilogue::kBiasGradFromA;
  weight_and_bias_backward(l, dtype, grad_dtype, dw, dbias, dout, N, OC);
}

}  // namespace zrt::kernels::cuda
