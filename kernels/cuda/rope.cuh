// CUDA twin of kernels/cpu/rope.h: one thread per rotated pair; the angle (the token's position,
// positions[b*T+t] or t, times the pair's frequency) and its sine and cosine in double, as the CPU
// twin. The frequency table travels by value as a kernel argument.
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/rope_table.h"

namespace zrt::kernels::cuda {

void rope_forward(const Launch& l, DType dtype, void* out, const void* inp, const RopeTable& table,
                  int B, int T, int NH, int hs, const std::int32_t* positions = nullptr);
void rope_backward(const Launch& l, DType dtype, void* dinp, const void* dout,
                   const RopeTable& table, int B, int T, int NH, int hs,
                   const std::int32_t* positions = nullptr);

}  // namespace zrt::kernels::cuda
