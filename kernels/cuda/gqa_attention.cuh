// CUDA twin of kernels/cpu/gqa_attention.h: q and the key/value heads, repeated for each query
// head of their group, are packed into attention.cu's (B,T,3C) qkv layout in the storage dtype,
// and attention.cu runs on it (the fused tensor-core kernels for bf16/fp16 with head size 64 or
// 128 and T a multiple of 64, the batched-GEMM path otherwise), keeping each row's log-sum-exp; the
// backward packs again, and the key/value gradients are summed over their group in a fixed
// order (fp32, rounded once) when unpacked. doc_start (packed documents) goes to the packed
// attention as it is. Workspace: the packed tensors, then attention's own.
#pragma once

#include <cstdint>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/cuda_common.cuh"

namespace zrt::kernels::cuda {

// kernels: attention.cuh's choice of the fused or batched kernels for the packed attention.
std::int64_t gqa_attention_forward_workspace(DType dtype, int B, int T, int NH, int NKV, int hs,
                                             const AttentionKernels& kernels = {});
void gqa_attention_forward(const Launch& l, DType dtype, void* out, float* lse, const void* q,
                           const void* k, const void* v, int B, int T, int NH, int NKV, int hs,
                           const AttentionKernels& kernels = {},
                           const std::int32_t* doc_start = nullptr);

std::int64_t gqa_attention_backward_workspace(DType dtype, int B, int T, int NH, int NKV, int hs,
                                              const AttentionKernels& kernels = {});
void gqa_attention_backward(const Launch& l, DType dtype, void* dq, void* dk, void* dv,
                            const void* dout, const void* q, const void* k, const void* v,
                            const void* out, const float* lse, int B, int T, int NH, int NKV,
                            int hs, const AttentionKernels& kernels = {},
                            const std::int32_t* doc_start = nullptr);

}  // namespace zrt::kernels::cuda
