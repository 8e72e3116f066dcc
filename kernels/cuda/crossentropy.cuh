// CUDA twin of kernels/cpu/crossentropy.h: the tied-embedding logits (cublasGemmEx), softmax
// cross-entropy forward/backward (one block per row; a target < 0 is a row out of the loss: loss
// 0, a zero dlogits row) and the mean loss (one block, double accumulation in a fixed order,
// divided by `divisor` when it is > 0, else by N). `ldl` is the logits' row stride (>= V; ops.cc
// resolves 0).
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"

namespace zrt::kernels::cuda {

// l.ws bytes logits_forward needs: the weights' last rows padded to ldl rows (those from V
// rounded down to a multiple of 8; the others are read in place). logits_backward needs none.
std::int64_t logits_workspace(DType dtype, int C, int V, int ldl);
void logits_forward(const Launch& l, DType dtype, void* logits, const void* inp, const void* wte,
                    int N, int C, int V, int ldl);
void logits_backward(const Launch& l, DType dtype, DType grad_dtype, void* dinp, void* dwte,
                     const void* dlogits, const void* inp, const void* wte, int N, int C, int V,
                     int ldl);
void crossentropy_forward(const Launch& l, DType dtype, float* losses, const void* logits,
                          const std::int32_t* targets, int N, int V, int ldl);
void crossentropy_backward(const Launch& l, DType dtype, void* dlogits, const void* logits,
                           const std::int32_t* targets, float dloss, int N, int V, int ldl);
// Both of the above in one kernel: each row's statistics once, its loss, then its gradient.
void crossentropy_forward_backward(const Launch& l, DType dtype, float* losses, void* dlogits,
                                   const void* logits, const std::int32_t* targets, float dloss,
                                   int N, int V, int ldl);
void loss_mean(const Launch& l, float* out, const float* losses, int N, float divisor = 0.0f);

}  // namespace zrt::kernels::cuda
