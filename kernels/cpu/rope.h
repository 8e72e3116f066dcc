// Rotary position embeddings (RoPE) in Hugging Face's "rotate half" layout, CPU twin of
// kernels/cuda/rope.cu.
//
// x (B,T,NH,hs) holds NH heads of hs = 2*P at position pos(b,t) for row (b,t): positions[b*T+t]
// (packed documents: positions restart at 0 in each document), or t when positions is null.
// With angle = pos(b,t) * inv_freq[i] (kernels/rope_table.h), cos and sin times the table's
// attention_scaling (yarn's; 1 otherwise), and i < P:
//   forward:  out[i]   = x[i] cos - x[i+P] sin,   out[i+P] = x[i+P] cos + x[i] sin
//   backward: the transposed map (the rotation by -angle, scaled alike) of dout:
//             dinp[i]  = dout[i] cos + dout[i+P] sin,  dinp[i+P] = dout[i+P] cos - dout[i] sin
// Both OVERWRITE their output (no accumulation), which may equal the input (in place): the
// model rotates q and k where they are, and turns their gradients back the same way.
//
// The angle and its sine and cosine are computed in double, then used in acc_t<S>.
#pragma once

#include <cstdint>

#include "kernels/cpu/cpu_common.h"
#include "kernels/rope_table.h"

namespace zrt::kernels::cpu {

template <typename S>
void rope_forward(S* out, const S* inp, const RopeTable& table, int B, int T, int NH, int hs,
                  const std::int32_t* positions = nullptr);

template <typename S>
void rope_backward(S* dinp, const S* dout, const RopeTable& table, int B, int T, int NH, int hs,
                   const std::int32_t* positions = nullptr);

}  // namespace zrt::kernels::cpu
