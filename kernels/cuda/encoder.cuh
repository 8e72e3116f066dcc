// CUDA twin of kernels/cpu/encoder.h (token + position embedding). The backward sums each
// token's rows in (b,t) order, as the CPU twin, so it is deterministic; token ids are not
// checked on the GPU (the CPU twin throws on ids outside [0,V)).
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"

namespace zrt::kernels::cuda {

void encoder_forward(const Launch& l, DType dtype, void* out, const std::int32_t* tokens,
                     const void* wte, const void* wpe, int B, int T, int C, int V);

// Scratch bytes encoder_backward needs in Launch::ws.
std::int64_t encoder_backward_workspace(int B, int T);
void encoder_backward(const Launch& l, DType dtype, DType grad_dtype, void* dwte, void* dwpe,
                      const void* dout, const std::int32_t* tokens, int B, int T, int C, int V);

}  // namespace zrt::kernels::cuda
