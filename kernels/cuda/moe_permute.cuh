// CUDA twin of kernels/cpu/moe_permute.h. The dispatch plan is two kernels with no atomics: one
// block per expert scans the pairs in order and ranks those choosing it (a block-wide prefix
// count, so the sort is stable), then one thread per pair adds its expert's offset (each block
// scans the counts itself). Gather, combine and their backwards are element-wise over rows, each
// sum in slot order; dweights is one warp per pair (a fixed shuffle tree).
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"

namespace zrt::kernels::cuda {

void moe_dispatch_plan(const Launch& l, std::int32_t* counts, std::int32_t* offsets,
                       std::int32_t* row_of, std::int32_t* source, const std::int32_t* experts,
                       int N, int k, int E);
void moe_gather(const Launch& l, DType dtype, void* xe, const void* x, const std::int32_t* row_of,
                int N, int k, int C);
void moe_gather_backward(const Launch& l, DType dtype, void* dx, const void* dxe,
                         const std::int32_t* row_of, int N, int k, int C);
void moe_combine(const Launch& l, DType dtype, void* out, const void* y, const float* weights,
                 const std::int32_t* row_of, int N, int k, int C);
void moe_combine_backward(const Launch& l, DType dtype, void* dy, float* dweights, const void* dout,
                          const void* y, const float* weights, const std::int32_t* row_of, int N,
                          int k, int C);

}  // namespace zrt::kernels::cuda
