// Causal grouped-query self-attention (Llama, Qwen2, Mistral), CPU twin of
// kernels/cuda/gqa_attention.cu.
//
// q (B,T,NH,hs), k and v (B,T,NKV,hs), out (B,T,NH,hs); NKV divides NH and query head h reads
// key/value head h / (NH/NKV) (NKV == NH is ordinary multi-head attention). For each (b,h):
//   forward:  att = softmax(q k^T / sqrt(hs)) with t2 > t masked (stored (B,NH,T,T), zeros
//             above the diagonal);  out[b,:,h] = att @ v
//   backward: datt = dout v^T;  dv += att^T dout;  ds = att * (datt - rowsum(att*datt));
//             dq += ds k / sqrt(hs);  dk += ds^T q / sqrt(hs)   (dk, dv summed over the group)
//
// att is kept in acc_t<S>. Work is parallel over (b, kv head) pairs, the group's query heads in
// order inside one task, so dk/dv sums have a fixed order and results do not depend on the
// thread count. 16-bit storage converts to fp32 in `ws` first (gqa_attention_*_workspace(...)
// elements); the backward also uses ws for datt.
#pragma once

#include <cstdint>

#include "kernels/cpu/cpu_common.h"

namespace zrt::kernels::cpu {

template <typename S>
std::int64_t gqa_attention_forward_workspace(int B, int T, int NH, int NKV, int hs);
template <typename S>
std::int64_t gqa_attention_backward_workspace(int B, int T, int NH, int NKV, int hs);

template <typename S>
void gqa_attention_forward(S* out, acc_t<S>* att, const S* q, const S* k, const S* v, int B, int T,
                           int NH, int NKV, int hs, acc_t<S>* ws);

template <typename S>
void gqa_attention_backward(S* dq, S* dk, S* dv, const S* dout, const S* q, const S* k, const S* v,
                            const acc_t<S>* att, int B, int T, int NH, int NKV, int hs,
                            acc_t<S>* ws);

}  // namespace zrt::kernels::cpu
