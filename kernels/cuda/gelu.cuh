// CUDA twin of kernels/cpu/gelu.h (GELU, tanh approximation); elementwise.
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"

namespace zrt::kernels::cuda {

void gelu_forward(const Launch& l, DType dtype, void* out, const void* inp, std::int64_t n);
void gelu_backward(const Launch& l, DType dtype, void* dinp, const void* inp, const void* dout,
                   std::int64_t n);

}  // namespace zrt::kernels::cuda
