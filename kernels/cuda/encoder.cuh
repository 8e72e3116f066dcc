// CUDA twin of kernels/cpu/encoder.h (token + position embedding, positions[b*T+t] or t). The
// backward sums each token's rows in (b,t) order, as the CPU twin, so it is deterministic, and
// with positions each position's rows the same way; token ids and positions are not checked on
// the GPU (the CPU twin throws on ids outside [0,V) and positions outside [0,T)).
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"

namespace zrt::kernels::cuda {

void encoder_forward(const Launch& l, DType dtype, void* out, const std::int32_t* tokens,
                     const void* wte, const void* wpe, int B, int T, int C, int V,
                     const std::int32_t* positions = nullptr);

// Scratch bytes encoder_backward needs in Launch::ws; by_position: it is given positions and a
// dwpe (the position rows are then grouped as the token rows are, by positions in
// [0, position_rows): the rows of wpe).
std::int64_t encoder_backward_workspace(int B, int T, bool by_position = false);
void encoder_backward(const Launch& l, DType dtype, DType grad_dtype, void* dwte, void* dwpe,
                      const void* dout, const std::int32_t* tokens, int B, int T, int C, int V,
                      const std::int32_t* positions = nullptr, int position_rows = 0);

}  // namespace zrt::kernels::cuda
