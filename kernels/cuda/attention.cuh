// CUDA twin of kernels/cpu/attention.h (causal multi-head attention). q, k, v are permuted to
// (B,NH,T,hs) fp32 scratch, scores and outputs are strided-batched fp32 cuBLAS GEMMs, softmax
// and its backward are one warp per row. Same math (and fp32 internals) as the CPU twin.
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"

namespace zrt::kernels::cuda {

std::int64_t attention_forward_workspace(int B, int T, int C, int NH);
void attention_forward(const Launch& l, DType dtype, void* out, float* att, const void* qkv, int B,
                       int T, int C, int NH);

std::int64_t attention_backward_workspace(int B, int T, int C, int NH);
void attention_backward(const Launch& l, DType dtype, void* dqkv, const void* dout, const void* qkv,
                        const float* att, int B, int T, int C, int NH);

// The two softmax passes over `rows` rows of T (one warp per row), shared with
// gqa_attention.cu: att <- causal softmax of att (zeros above the diagonal), and
// datt <- att * (datt - rowsum(att * datt)) (zeros above the diagonal).
void causal_softmax(const Launch& l, float* att, std::int64_t rows, int T);
void causal_softmax_backward(const Launch& l, float* datt, const float* att, std::int64_t rows,
                             int T);

}  // namespace zrt::kernels::cuda
