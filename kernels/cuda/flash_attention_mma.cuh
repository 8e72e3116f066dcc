// The fused attention kernels on mma.sync (m16n8k16, bf16/fp16 in, fp32 accumulate), written to
// the PTX ISA's documented fragment layouts so that the scores stay in registers from one
// product to the next: the softmax and dS = P (dP - D) work on the accumulators directly, and
// an accumulator pair becomes the next product's A operand (FlashAttention-2's register reuse).
// Key/query tiles are staged once per block in shared memory with 16-byte loads. Same contract
// and results (up to summation order) as the WMMA kernels of flash_attention.cu, for head size
// 64 and also 128 (Llama-3 3B/8B, Mistral 7B, Qwen2.5 7B), where the WMMA kernels stop at 64.
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"

namespace zrt::kernels::cuda {

// Whether the head size C / NH is one these kernels are built for (64 or 128).
bool flash_mma_head_size_supported(int C, int NH);

// doc_start: packed documents as flash_attention.cuh's (null: one document per sequence).
void flash_mma_forward(const Launch& l, DType dtype, void* out, float* lse, const void* qkv, int B,
                       int T, int C, int NH, const std::int32_t* doc_start = nullptr);
// rowdot: D = dout . out per row, (B,NH,T) fp32, already computed.
void flash_mma_backward(const Launch& l, DType dtype, void* dqkv, const void* dout, const void* qkv,
                        const float* lse, const float* rowdot, int B, int T, int C, int NH,
                        const std::int32_t* doc_start = nullptr);

}  // namespace zrt::kernels::cuda
