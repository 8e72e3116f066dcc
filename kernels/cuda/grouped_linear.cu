#include "kernels/cuda/grouped_linear.cuh"

#include "kernels/cuda/gemm.cuh"

namespace zrt::kernels::cuda {

namespace {
using I64 = std::int64_t;

// Byte offset of element `elements` of a `dtype` array.
const char* at(const void* p, I64 elements, DType dtype) {
  return static_cast<const char*>(p) + elements * static_cast<I64>(dtype_size(dtype));
}
char* at(void* p, I64 elements, DType dtype) {
  return static_cast<char*>(p) + elements * static_cast<I64>(dtype_size(dtype));
}
}  // namespace

void grouped_linear_forward(const Launch& l, DType dtype, void* out, const void* inp,
                            const void* weight, const std::int32_t* offsets, int E, int IC, int OC,
                            std::int64_t weight_stride) {
  const cudaDataType type = to_cuda_dtype(dtype);
  const I64 stride = weight_stride > 0 ? weight_stride : I64{OC} * IC;
  for (int e = 0; e < E; ++e) {
    const int rows = offsets[e + 1] - offsets[e];
    if (rows == 0) continue;
    gemm(l, false, true, rows, OC, IC, 1.0f, at(inp, I64{offsets[e]} * IC, dtype), type, IC,
         at(weight, e * stride, dtype), type, IC, 0.0f, at(out, I64{offsets[e]} * OC, dtype), type,
         OC);
  }
}

void grouped_linear_backward(const Launch& l, DType dtype, DType grad_dtype, void* dinp,
                             void* dweight, const void* dout, const void* inp, const void* weight,
                             const std::int32_t* offsets, int E, int IC, int OC,
                             GradWrite dinp_write, std::int64_t weight_stride) {
  const cudaDataType type = to_cuda_dtype(dtype);
  const I64 stride = weight_stride > 0 ? weight_stride : I64{OC} * IC;
  const cudaDataType grad_type = to_cuda_dtype(grad_dtype);
  const float dinp_beta = dinp_write == GradWrite::kOverwrite ? 0.0f : 1.0f;
  for (int e = 0; e < E; ++e) {
    const int rows = offsets[e + 1] - offsets[e];
    if (rows == 0) continue;
    const char* dout_e = at(dout, I64{offsets[e]} * OC, dtype);
    const char* weight_e = at(weight, e * stride, dtype);
    if (dinp != nullptr) {
      // dinp (rows, IC) (+)= dout (rows, OC) @ weight (OC, IC).
      gemm(l, false, false, rows, IC, OC, 1.0f, dout_e, type, OC, weight_e, type, IC, dinp_beta,
           at(dinp, I64{offsets[e]} * IC, dtype), type, IC);
    }
    // dweight (OC, IC) += dout^T (OC, rows) @ inp (rows, IC); none for a frozen weight.
    if (dweight != nullptr) {
      gemm(l, true, false, OC, IC, rows, 1.0f, dout_e, type, OC,
           at(inp, I64{offsets[e]} * IC, dtype), type, IC, 1.0f,
           at(dweight, e * stride, grad_dtype), grad_type, IC);
    }
  }
}

}  // namespace zrt::kernels::cuda
