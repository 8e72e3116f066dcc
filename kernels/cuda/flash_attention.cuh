// Fused causal attention on tensor cores (FlashAttention-2's scheme, written for zrt): the
// forward streams key/value tiles past a tile of 64 queries, keeping a running max and sum per
// row (online softmax) so the (T,T) scores never reach memory, and writes out and each row's
// log-sum-exp; the backward recomputes the probabilities from that statistic, once per key tile
// (dK, dV) and once per query tile (dQ), so neither pass needs atomics: results are
// deterministic. Products run as 16x16x16 bf16/fp16 WMMA with fp32 accumulation; softmax
// statistics, the scores and the row term D = dout.out stay fp32. Probabilities and dS are
// rounded to the storage type before their products (as FlashAttention does); the CPU twin
// (kernels/cpu/attention.h) keeps them in fp32, the difference the parity tests bound.
//
// Packed documents (doc_start (B,T), kernels/ops.h; null: one document per sequence): query t sees
// keys [doc_start[t], t]. As FlashAttention's varlen kernels, the work follows the documents: the
// forward and dQ start each query tile's key loop at the tile holding its first query's document
// start (doc_start is non-decreasing), dK/dV stop a key tile's query loop at the first query tile
// whose documents all start after the key tile, and tiles partly covered are masked per element.
// A sliding window (window W > 0, kernels/ops.h) moves each query's first key to t - W + 1 where
// that is later; it stays non-decreasing, so the same skipping makes a windowed pass cost about
// T*W instead of T^2/2.
//
// Shapes it takes (attention.cu falls back to batched GEMMs for the rest): bf16 or fp16 storage,
// head size 64 (both implementations) or 128 (the mma.sync kernels), T a multiple of 64, qkv and
// dout 32-byte aligned. Needs sm_80 or newer (the build's default architectures are 80 and 90).
#pragma once

#include <cstdint>

#include "kernels/cuda/attention_plan.h"
#include "kernels/cuda/cuda_common.cuh"

namespace zrt::kernels::cuda {

// Two implementations of the same kernels (attention_plan.h's FlashKernels): kMma
// (flash_attention_mma.cuh: mma.sync with the scores kept in registers, the default; kMmaPipelined
// runs them with the next tile's copy in flight) and kWmma (this file: the WMMA API, the scores
// through shared memory; slower, kept as the second opinion the GPU tests compare against; head
// size 64 only). Which shapes they take
// (flash_attention_supported, flash_gqa_supported) and the backward's workspace
// (flash_attention_backward_workspace): attention_plan.h.

// out (B,T,C), lse (B,NH,T) fp32, qkv (B,T,3C): kernels/cpu/attention.h's forward.
void flash_attention_forward(const Launch& l, DType dtype, void* out, float* lse, const void* qkv,
                             int B, int T, int C, int NH, FlashKernels kernels = FlashKernels::kMma,
                             const std::int32_t* doc_start = nullptr, int window = 0);

// l.ws: flash_attention_backward_workspace bytes (the row term D, (B,NH,T) fp32).
// dqkv (B,T,3C) += the gradients; dout, out (B,T,C); lse from the forward.
void flash_attention_backward(const Launch& l, DType dtype, void* dqkv, const void* dout,
                              const void* qkv, const void* out, const float* lse, int B, int T,
                              int C, int NH, FlashKernels kernels = FlashKernels::kMma,
                              const std::int32_t* doc_start = nullptr, int window = 0);

// Grouped-query attention on the mma kernels where q (B,T,NH*hs), k and v (B,T,NKV*hs) are, query
// head h reading key/value head h / (NH/NKV): nothing is packed or repeated, so the forward
// needs no workspace and the backward only flash_attention_backward_workspace's row term (for
// Llama-3.1-8B at 128K tokens 16 MiB, against 6.5 GB of packed q, k, v and their gradient). The
// backward adds to dq, dk, dv; dk and dv are each group's sum, kept in fp32 and rounded once.
// Takes what flash_attention_supported(kMma) takes at C = NH*hs; rows 16-byte aligned.
// kernels: kMma or kMmaPipelined.
void flash_gqa_forward(const Launch& l, DType dtype, void* out, float* lse, const void* q,
                       const void* k, const void* v, int B, int T, int NH, int NKV, int hs,
                       const std::int32_t* doc_start = nullptr, int window = 0,
                       FlashKernels kernels = FlashKernels::kMma);
void flash_gqa_backward(const Launch& l, DType dtype, void* dq, void* dk, void* dv,
                        const void* dout, const void* q, const void* k, const void* v,
                        const void* out, const float* lse, int B, int T, int NH, int NKV, int hs,
                        const std::int32_t* doc_start = nullptr, int window = 0,
                        FlashKernels kernels = FlashKernels::kMma);

}  // namespace zrt::kernels::cuda
