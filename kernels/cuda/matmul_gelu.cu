#include "kernels/cuda/matmul_gelu.cuh"

#include "kernels/cuda/gelu.cuh"
#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/matmul.cuh"
#include "runtime/device/cuda_device.h"

namespace zrt::kernels::cuda {

void matmul_gelu_forward(const Launch& l, DType dtype, void* out, void* pre, const void* inp,
                         const void* weight, const void* bias, int N, int C, int OC) {
  if (bias != nullptr) {
    // Row-major pre = inp @ weight + bias, out = gelu(pre): D is out, the aux matrix pre.
    LtGemm g = lt_gemm(false, false, N, OC, C, inp, C, weight, OC, out, OC, to_cuda_dtype(dtype));
    g.epilogue = LtEpilogue::kGeluAuxBias;
    g.bias = bias;
    g.aux = pre;
    g.aux_ld = OC;
    if (gemm_lt(l, g)) return;
  }
  matmul_forward(l, dtype, pre, inp, weight, bias, N, C, OC);
  gelu_forward(l, dtype, out, pre, static_cast<std::int64_t>(N) * OC);
}

void matmul_dgelu_backward(const Launch& l, DType dtype, DType grad_dtype, void* dpre,
                           void* scratch, void* dweight, void* dbias, const void* dout,
                           const void* act, const void* weight, const void* pre, int N, int C,
                           int OC) {
  // Row-major dpre = gelu'(pre) * (dout @ weight^T): weight (C,OC) transposed, aux = pre.
  LtGemm g = lt_gemm(false, true, N, C, OC, dout, OC, weight, OC, dpre, C, to_cuda_dtype(dtype));
  g.epilogue = LtEpilogue::kDGelu;
  g.aux = const_cast<void*>(pre);  // read only: DGELU's aux is an input
  g.aux_ld = C;
  if (!gemm_lt(l, g)) {
    // scratch = dout @ weight^T, as matmul_backward's input gradient (overwritten).
    const cudaDataType type = to_cuda_dtype(dtype);
    gemm(l, false, true, N, C, OC, 1.0f, dout, type, OC, weight, type, OC, 0.0f, scratch, type, C);
    const std::size_t bytes = static_cast<std::size_t>(N) * C * dtype_size(dtype);
    ZRT_CUDA_CHECK(cudaMemsetAsync(dpre, 0, bytes, l.stream));  // gelu_backward accumulates
    gelu_backward(l, dtype, dpre, pre, scratch, static_cast<std::int64_t>(N) * C);
  }
  // The weight and bias gradients: matmul_backward without its input gradient.
  matmul_backward(l, dtype, grad_dtype, nullptr, dweight, dbias, dout, act, weight, N, C, OC,
                  GradWrite::kAccumulate);
}

}  // namespace zrt::kernels::cuda
