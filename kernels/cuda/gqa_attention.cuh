// CUDA twin of kernels/cpu/gqa_attention.h. q, k, v are gathered into fp32 head-major copies
// (B, NH, T, hs), the key/value heads repeated for each query head of their group, so the math
// is attention.cu's strided-batched cuBLAS GEMMs and warp softmax over B*NH heads; the key/value
// gradients are summed over their group in a fixed order when scattered back.
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"

namespace zrt::kernels::cuda {

std::int64_t gqa_attention_forward_workspace(int B, int T, int NH, int NKV, int hs);
void gqa_attention_forward(const Launch& l, DType dtype, void* out, float* att, const void* q,
                           const void* k, const void* v, int B, int T, int NH, int NKV, int hs);

std::int64_t gqa_attention_backward_workspace(int B, int T, int NH, int NKV, int hs);
void gqa_attention_backward(const Launch& l, DType dtype, void* dq, void* dk, void* dv,
                            const void* dout, const void* q, const void* k, const void* v,
                            const float* att, int B, int T, int NH, int NKV, int hs);

}  // namespace zrt::kernels::cuda
