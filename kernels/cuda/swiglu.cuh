// CUDA twin of kernels/cpu/swiglu.h: elementwise silu(gate) * up and its gradients, in fp32.
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"

namespace zrt::kernels::cuda {

void swiglu_forward(const Launch& l, DType dtype, void* out, const void* gate, const void* up,
                    std::int64_t n);
void swiglu_backward(const Launch& l, DType dtype, void* dgate, void* dup, const void* dout,
                     const void* gate, const void* up, std::int64_t n);

}  // namespace zrt::kernels::cuda
