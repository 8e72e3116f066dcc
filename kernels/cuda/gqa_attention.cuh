// CUDA twin of kernels/cpu/gqa_attention.h, on two paths. Where the fused mma kernels take the
// shape (bf16/fp16, head size 64 or 128, T a multiple of 64; attention.cuh's runs_fused) they
// read q, k, v where they are (flash_attention.cuh's flash_gqa_*): query head h reads key/value
// head h / group, and the dK/dV kernel sums each group in registers, so nothing is repeated
// (workspace: the backward's (B,NH,T) row term). Elsewhere, and when asked
// (KernelOptions::cuda_gqa_packed; or the WMMA kernels, which read packed rows only), q and the
// key/value heads repeated for each query head of their group are packed into attention.cu's
// (B,T,3C) qkv layout in the storage dtype and attention.cu runs on it (fused or batched GEMMs),
// keeping each row's log-sum-exp; the backward packs again, and the key/value gradients are
// summed over their group in a fixed order (fp32, rounded once) when unpacked (workspace: the
// packed tensors, then attention's own). doc_start (packed documents) goes to either as it is.
#pragma once

#include <cstdint>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/cuda_common.cuh"

namespace zrt::kernels::cuda {

// kernels: attention_plan.h's choice of the fused or batched kernels, and of the packed path;
// whether these shapes run in place (gqa_runs_in_place) and each pass's workspace
// (gqa_attention_forward_workspace, gqa_attention_backward_workspace) are there too.
void gqa_attention_forward(const Launch& l, DType dtype, void* out, float* lse, const void* q,
                           const void* k, const void* v, int B, int T, int NH, int NKV, int hs,
                           const AttentionKernels& kernels = {},
                           const std::int32_t* doc_start = nullptr, int window = 0);

void gqa_attention_backward(const Launch& l, DType dtype, void* dq, void* dk, void* dv,
                            const void* dout, const void* q, const void* k, const void* v,
                            const void* out, const float* lse, int B, int T, int NH, int NKV,
                            int hs, const AttentionKernels& kernels = {},
                            const std::int32_t* doc_start = nullptr, int window = 0);

}  // namespace zrt::kernels::cuda
