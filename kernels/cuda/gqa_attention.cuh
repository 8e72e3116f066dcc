// CUDA twin of kernels/cpu/gqa_attention.h: q and the key/value heads, repeated for each query
// head of their group, are packed into attention.cu's (B,T,3C) qkv layout in the storage dtype,
// and attention.cu runs on it (the fused tensor-core kernels for bf16/fp16 with head size 64 and
// T a multiple of 64, the batched-GEMM path otherwise), keeping each row's log-sum-exp; the
// backward packs again, and the key/value gradients are summed over their group in a fixed
// order (fp32, rounded once) when unpacked. Workspace: the packed tensors, then attention's own.
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"

namespace zrt::kernels::cuda {

std::int64_t gqa_attention_forward_workspace(DType dtype, int B, int T, int NH, int NKV, int hs);
void gqa_attention_forward(const Launch& l, DType dtype, void* out, float* lse, const void* q,
                           const void* k, const void* v, int B, int T, int NH, int NKV, int hs,
                           bool wmma = false);

std::int64_t gqa_attention_backward_workspace(DType dtype, int B, int T, int NH, int NKV, int hs);
void gqa_attention_backward(const Launch& l, DType dtype, void* dq, void* dk, void* dv,
                            const void* dout, const void* q, const void* k, const void* v,
                            const void* out, const float* lse, int B, int T, int NH, int NKV,
                            int hs, bool wmma = false);

}  // namespace zrt::kernels::cuda
