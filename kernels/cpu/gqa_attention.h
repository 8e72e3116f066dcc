// Causal grouped-query self-attention (Llama, Qwen2, Mistral), CPU twin of
// kernels/cuda/gqa_attention.cu, on the same contract as GPT's attention (kernels/cpu/attention.h):
// only each query row's log-sum-exp is kept for the backward, not the (B,NH,T,T) probabilities
// (for Llama-3.1-8B at T = 8192 those were 8.6 GB per layer).
//
// q (B,T,NH,hs), k and v (B,T,NKV,hs), out (B,T,NH,hs), lse (B,NH,T) in acc_t<S>; NKV divides NH
// and query head h reads key/value head h / (NH/NKV) (NKV == NH is ordinary multi-head
// attention). On the tiled path with fp32 or fp64 storage the passes read q, k, v where they are
// (tiled_attention.h's grouped-query form: no packed copies, so no workspace that grows with T
// beyond the (B,NH,T) row term); otherwise (the full kernel, 16-bit storage) both passes pack q
// and the repeated k, v heads into GPT's (B,T,3C) qkv layout (C = NH*hs) in acc_t<S> and run
// attention.h's algorithm on it. The two forms give the same bits:
//   forward:  out[b,:,h] = softmax(q k^T / sqrt(hs)) v with t2 > t masked;  lse per row
//   backward: the probabilities recomputed from lse, D from dout and out; then dq += the packed
//             gradient's q part, dk (dv) += the sum over each group's heads of its k (v) part,
//             heads in order, rounded once to S.
// Packed documents: doc_start (B,T) as attention.h's (null: one document per sequence), passed
// on to the packed attention, so query t attends keys [doc_start[t], t] only; a sliding `window`
// (0: none) as attention.h's.
// Results do not depend on the thread count. Workspace: gqa_attention_*_workspace(...) elements
// of acc_t<S>. `path` picks attention.h's algorithm (attention_path.h: full or tiled; kAuto by
// ZRT_CPU_ATTENTION and the threshold), the same for the workspace functions and the kernels.
#pragma once

#include <cstdint>

#include "kernels/cpu/attention_path.h"
#include "kernels/cpu/cpu_common.h"

namespace zrt::kernels::cpu {

template <typename S>
std::int64_t gqa_attention_forward_workspace(int B, int T, int NH, int NKV, int hs,
                                             AttentionPath path = AttentionPath::kAuto);
template <typename S>
std::int64_t gqa_attention_backward_workspace(int B, int T, int NH, int NKV, int hs,
                                              AttentionPath path = AttentionPath::kAuto);

template <typename S>
void gqa_attention_forward(S* out, acc_t<S>* lse, const S* q, const S* k, const S* v, int B, int T,
                           int NH, int NKV, int hs, acc_t<S>* ws,
                           const std::int32_t* doc_start = nullptr, int window = 0,
                           AttentionPath path = AttentionPath::kAuto);

// `out` and `lse` are the forward's results for the same q, k, v, doc_start and window.
template <typename S>
void gqa_attention_backward(S* dq, S* dk, S* dv, const S* dout, const S* q, const S* k, const S* v,
                            const S* out, const acc_t<S>* lse, int B, int T, int NH, int NKV,
                            int hs, acc_t<S>* ws, const std::int32_t* doc_start = nullptr,
                            int window = 0, AttentionPath path = AttentionPath::kAuto);

// The packing both passes use (exposed for the CUDA twin's tests): qkv (B,T,3C) <- q, and k, v
// with each kv head repeated for its group's query heads; and dq += dqkv's q part, dk (dv) +=
// the group sums of its k (v) part.
template <typename S, typename A>
void gqa_pack_qkv(A* qkv, const S* q, const S* k, const S* v, int B, int T, int NH, int NKV,
                  int hs);
template <typename S, typename A>
void gqa_unpack_dqkv(S* dq, S* dk, S* dv, const A* dqkv, int B, int T, int NH, int NKV, int hs);

}  // namespace zrt::kernels::cpu
