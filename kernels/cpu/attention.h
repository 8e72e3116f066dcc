// Causal multi-head self-attention with softmax, CPU twin of kernels/cuda/attention.cu.
//
// qkv (B,T,3C) holds [q | k | v] along the last dimension, each C = NH heads of hs = C/NH
// (GPT-2's c_attn output split and viewed as (B,T,NH,hs)). For each (b,h):
//   forward:  att = softmax(q k^T / sqrt(hs)) with t2 > t masked (stored (B,NH,T,T), zeros
//             above the diagonal);  out[b,:,h] = att @ v                      out (B,T,C)
//   backward: datt = dout v^T;  dv += att^T dout;  ds = att * (datt - rowsum(att*datt));
//             dq += ds k / sqrt(hs);  dk += ds^T q / sqrt(hs)                  dqkv (B,T,3C)
//
// att is kept in acc_t<S> (fp32 for 16-bit storage). Work is parallel over (b,h) pairs, each
// with single-threaded BLAS calls on strided views, so results do not depend on the thread
// count. 16-bit storage converts to fp32 in `ws` first (attention_*_workspace(...) elements);
// the backward also uses ws for datt of up to kAttentionPairGroup pairs at a time.
#pragma once

#include <cstdint>

#include "kernels/cpu/cpu_common.h"

namespace zrt::kernels::cpu {

constexpr int kAttentionPairGroup = 32;

template <typename S>
std::int64_t attention_forward_workspace(int B, int T, int C, int NH);
template <typename S>
std::int64_t attention_backward_workspace(int B, int T, int C, int NH);

template <typename S>
void attention_forward(S* out, acc_t<S>* att, const S* qkv, int B, int T, int C, int NH,
                       acc_t<S>* ws);

template <typename S>
void attention_backward(S* dqkv, const S* dout, const S* qkv, const acc_t<S>* att, int B, int T,
                        int C, int NH, acc_t<S>* ws);

}  // namespace zrt::kernels::cpu
