// The sigmoid gate of Qwen2-MoE's shared expert: CPU twin of kernels/cuda/moe_shared_gate.cu.
//
// transformers' Qwen2MoeSparseMoeBlock adds sigmoid(shared_expert_gate(x)) * shared_expert(x) to
// the routed experts' output; with s (N,C) the shared expert's output and g (N) its gate's logit
// (storage S, read as acc_t<S>):
//   forward:   out[n,c] += sigmoid(g[n]) * s[n,c]          (out holds the routed combine)
//   backward:  ds[n,c]   = sigmoid(g[n]) * dout[n,c]       (OVERWRITES ds)
//              dg[n]     = sigmoid(g[n]) * (1 - sigmoid(g[n])) * dot(dout[n], s[n])  (OVERWRITES)
// The dot runs in channel order in acc_t<S>: the same bits on every run and thread count.
#pragma once

#include "kernels/cpu/cpu_common.h"

namespace zrt::kernels::cpu {

template <typename S>
void moe_shared_gate_forward(S* out, const S* s, const S* g, int N, int C);
template <typename S>
void moe_shared_gate_backward(S* ds, S* dg, const S* dout, const S* s, const S* g, int N, int C);

}  // namespace zrt::kernels::cpu
