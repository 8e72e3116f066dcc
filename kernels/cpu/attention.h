// Causal multi-head self-attention with softmax, CPU twin of kernels/cuda/attention.cu (and of
// the fused kernels in kernels/cuda/flash_attention.cu).
//
// qkv (B,T,3C) holds [q | k | v] along the last dimension, each C = NH heads of hs = C/NH
// (GPT-2's c_attn output split and viewed as (B,T,NH,hs)). For each (b,h), with s = q k^T /
// sqrt(hs) and t2 > t masked:
//   forward:  p = softmax(s);  out[b,:,h] = p @ v                               out (B,T,C)
//             lse[b,h,t] = log(sum_{u<=t} exp(s[t,u]))                          lse (B,NH,T)
//   backward: p = exp(s - lse) recomputed;  dp = dout v^T;  dv += p^T dout;
//             D[t] = sum_d dout[t,d] * out[t,d];  ds = p * (dp - D);
//             dq += ds k / sqrt(hs);  dk += ds^T q / sqrt(hs)                   dqkv (B,T,3C)
// Only the row statistic lse is kept between the passes (O(T) per head, not the O(T^2)
// probabilities): the backward recomputes p, as FlashAttention does, and takes D from the
// forward's output (the same algorithm as the fused CUDA kernels, so the twins agree).
//
// Packed documents (doc_start (B,T), kernels/cpu/documents.h; null: one document per sequence):
// query t attends keys [doc_start[t], t] only. Each pass runs the steps above on each document
// of a sequence as on a sequence of its own (its rows of q, k, v and its own L x L scores), so a
// packed call costs the sum of its documents' squares, not T^2, and each document's results are
// those of running it alone. With doc_start null, or one document per sequence, the calls are
// exactly those of the unpacked op. An invalid doc_start throws InvalidArgument.
//
// Sliding window (`window` W > 0, documents.h): query t sees keys [max(doc_start[t], t-W+1), t],
// as transformers' sliding_window mask (Mistral; Qwen2's layers from max_window_layers on). A
// window of T or more hides nothing and runs as none. The full path masks the keys before the
// window in each document's scores; the tiled one also skips the key tiles entirely before it, so
// its cost grows with T*W instead of T^2.
//
// lse is fp32 (acc_t<S>). 16-bit storage converts to fp32 in `ws` first. Two algorithms
// (attention_path.h), chosen per call by `path` (kAuto: ZRT_CPU_ATTENTION, else a threshold on
// the full kernel's score bytes); results do not depend on the thread count on either:
//   full:  work parallel over (b,h) pairs, each with single-threaded BLAS calls on strided views;
//          both passes keep the scores of up to kAttentionPairGroup pairs at a time in ws (enough
//          for documents up to T long): min(32, B*NH) * T^2 elements, twice that backward.
//   tiled: flash-style over (b, h, query tile) and (b, h, key tile) (tiled_attention.h): an
//          online softmax over key tiles; no T^2 term in its workspace.
// The two agree within fp32 rounding, not bit for bit (the tiled sums run in another order).
// attention_*_workspace(..., path) returns the elements of acc_t<S> the path resolved from the
// same arguments uses; pass the same path (and B, T, NH) to the kernel.
#pragma once

#include <cstdint>

#include "kernels/cpu/attention_path.h"
#include "kernels/cpu/cpu_common.h"

namespace zrt::kernels::cpu {

constexpr int kAttentionPairGroup = 32;

template <typename S>
std::int64_t attention_forward_workspace(int B, int T, int C, int NH,
                                         AttentionPath path = AttentionPath::kAuto);
template <typename S>
std::int64_t attention_backward_workspace(int B, int T, int C, int NH,
                                          AttentionPath path = AttentionPath::kAuto);

template <typename S>
void attention_forward(S* out, acc_t<S>* lse, const S* qkv, int B, int T, int C, int NH,
                       acc_t<S>* ws, const std::int32_t* doc_start = nullptr, int window = 0,
                       AttentionPath path = AttentionPath::kAuto);

// `out` and `lse` are the forward's results for the same qkv, doc_start and window.
template <typename S>
void attention_backward(S* dqkv, const S* dout, const S* qkv, const S* out, const acc_t<S>* lse,
                        int B, int T, int C, int NH, acc_t<S>* ws,
                        const std::int32_t* doc_start = nullptr, int window = 0,
                        AttentionPath path = AttentionPath::kAuto);

}  // namespace zrt::kernels::cpu
