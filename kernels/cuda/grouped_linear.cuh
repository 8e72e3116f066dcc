// CUDA twin of kernels/cpu/grouped_linear.h: one cublasGemmEx per expert with rows (fp32
// compute), enqueued on the stream back to back; the offsets are host values, so no expert's
// shape waits on the device. (cuBLAS's grouped GEMM takes its pointer arrays in device memory,
// which would cost a copy per call for the few large GEMMs an MoE layer has.)
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/grad_write.h"

namespace zrt::kernels::cuda {

void grouped_linear_forward(const Launch& l, DType dtype, void* out, const void* inp,
                            const void* weight, const std::int32_t* offsets, int E, int IC, int OC,
                            std::int64_t weight_stride);
void grouped_linear_backward(const Launch& l, DType dtype, DType grad_dtype, void* dinp,
                             void* dweight, const void* dout, const void* inp, const void* weight,
                             const std::int32_t* offsets, int E, int IC, int OC,
                             GradWrite dinp_write, std::int64_t weight_stride);

}  // namespace zrt::kernels::cuda
