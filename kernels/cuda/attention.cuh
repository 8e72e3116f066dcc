// CUDA twin of kernels/cpu/attention.h (causal multi-head attention, keeping each row's
// log-sum-exp). bf16/fp16 with head size 64 or 128 and T a multiple of 64 run the fused
// tensor-core kernels of flash_attention.cuh. Other shapes take the batched-GEMM path: q, k, v
// permuted to (B,NH,T,hs) fp32 scratch, scores and outputs as strided-batched fp32 cuBLAS GEMMs,
// softmax and its backward one warp per row, the probabilities recomputed in the backward from lse.
// doc_start (B,T) (packed documents, kernels/ops.h; null: one per sequence): query t attends keys
// [doc_start[t], t]. The fused kernels skip the key and query tiles outside the documents; the
// batched path still computes every score and sets those outside a query's document to -inf
// before its softmax (their probabilities then are exact zeros). A sliding window (window > 0,
// kernels/ops.h) is one more bound on each query's first key, taken the same ways.
#pragma once

#include <cstdint>

#include "kernels/cuda/attention_plan.h"
#include "kernels/cuda/cuda_common.cuh"

namespace zrt::kernels::cuda {

// The kernels' choice (AttentionKernels, runs_fused) and each pass's workspace (l.ws:
// attention_forward_workspace, attention_backward_workspace): attention_plan.h.
void attention_forward(const Launch& l, DType dtype, void* out, float* lse, const void* qkv, int B,
                       int T, int C, int NH, const AttentionKernels& kernels = {},
                       const std::int32_t* doc_start = nullptr, int window = 0);

void attention_backward(const Launch& l, DType dtype, void* dqkv, const void* dout, const void* qkv,
                        const void* out, const float* lse, int B, int T, int C, int NH,
                        const AttentionKernels& kernels = {},
                        const std::int32_t* doc_start = nullptr, int window = 0);

// The two softmax passes over `rows` rows of T (one warp per row), shared with
// gqa_attention.cu: att <- causal softmax of att (zeros above the diagonal; lse, if not null,
// gets each row's log-sum-exp), and datt <- att * (datt - rowsum(att * datt)) (zeros above the
// diagonal).
void causal_softmax(const Launch& l, float* att, std::int64_t rows, int T, float* lse = nullptr);
void causal_softmax_backward(const Launch& l, float* datt, const float* att, std::int64_t rows,
                             int T);

}  // namespace zrt::kernels::cuda
