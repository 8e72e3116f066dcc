// The fused attention kernels on mma.sync (m16n8k16, bf16/fp16 in, fp32 accumulate), written to
// the PTX ISA's documented fragment layouts so that the scores stay in registers from one
// product to the next: the softmax and dS = P (dP - D) work on the accumulators directly, and
// an accumulator pair becomes the next product's A operand (FlashAttention-2's register reuse).
// Key/query tiles are staged once per block in shared memory with 16-byte loads. Same contract
// and results (up to summation order) as the WMMA kernels of flash_attention.cu, for head size
// 64 and also 128 (Llama-3 3B/8B, Mistral 7B, Qwen2.5 7B), where the WMMA kernels stop at 64.
// They read q, k, v where they are (HeadRows): grouped-query attention runs on them without
// repeating its key/value heads, the dK/dV kernel summing each group's query heads in registers.
#pragma once

#include <cstdint>

#include "kernels/cuda/attention_plan.h"
#include "kernels/cuda/cuda_common.cuh"

namespace zrt::kernels::cuda {

// Where a pass reads q, k and v: rows of q_ld (q) and kv_ld (k and v) elements per token, query
// head h reading key/value head h / group. The packed attention's (B,T,3C) qkv is
// packed_head_rows (q, k, v at columns 0, C, 2C of rows of 3C, group 1); grouped-query attention
// passes its separate q (B,T,NH*hs), k and v (B,T,NKV*hs), so that nothing is repeated. Row
// starts must be 16-byte aligned (the tiles are staged with 16-byte loads).
struct HeadRows {
  const void* q;
  const void* k;
  const void* v;
  int q_ld;
  int kv_ld;
  int group;
};
// Where the backward adds dq, dk and dv: the same layout (and row strides) as its HeadRows.
struct HeadGradients {
  void* dq;
  void* dk;
  void* dv;
};
HeadRows packed_head_rows(const void* qkv, DType dtype, int C);
HeadGradients packed_head_gradients(void* dqkv, DType dtype, int C);

// Which head sizes these kernels are built for: attention_plan.h's
// flash_mma_head_size_supported (64 or 128).

// Two ways through each kernel's tile loop, the same arithmetic in the same order (so the same
// results bit for bit): staged (pipelined false), one tile at a time copied through registers
// into shared memory and its mma operands read element by element; pipelined (attention_plan.h's
// FlashKernels::kMmaPipelined), the next tile's copy in flight (cp.async, two buffers) while the
// current one is computed, its operands read with ldmatrix (mma_fragments.h).
//
// out (B,T,C = NH*hs), lse (B,NH,T). doc_start and window: packed documents and a sliding window
// as flash_attention.cuh's (null, 0: one document per sequence, no window).
void flash_mma_forward(const Launch& l, DType dtype, void* out, float* lse, const HeadRows& in,
                       int B, int T, int C, int NH, const std::int32_t* doc_start = nullptr,
                       int window = 0, bool pipelined = false);
// d.dq, d.dk, d.dv += the gradients (dk and dv summed over each group in fp32, rounded once).
// rowdot: D = dout . out per row, (B,NH,T) fp32, already computed.
void flash_mma_backward(const Launch& l, DType dtype, const HeadGradients& d, const void* dout,
                        const HeadRows& in, const float* lse, const float* rowdot, int B, int T,
                        int C, int NH, const std::int32_t* doc_start = nullptr, int window = 0,
                        bool pipelined = false);

}  // namespace zrt::kernels::cuda
