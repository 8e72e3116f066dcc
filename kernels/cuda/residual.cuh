// CUDA twin of kernels/cpu/residual.h (residual add); elementwise.
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"

namespace zrt::kernels::cuda {

void residual_forward(const Launch& l, DType dtype, void* out, const void* a, const void* b,
                      std::int64_t n);
void residual_backward(const Launch& l, DType dtype, void* da, void* db, const void* dout,
                       std::int64_t n);

}  // namespace zrt::kernels::cuda
