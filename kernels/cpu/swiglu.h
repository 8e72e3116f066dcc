// The SwiGLU gate of Llama's MLP, silu(gate) * up, CPU twin of kernels/cuda/swiglu.cu.
//
// With sig = 1/(1+exp(-g)) and silu(g) = g*sig:
//   forward:  out[i] = silu(gate[i]) * up[i]
//   backward: dgate[i] += dout[i] * up[i] * sig * (1 + g*(1-sig)),  dup[i] += dout[i] * silu(g)
// gate, up, out, dout, dgate, dup: n elements each; computed in acc_t<S>.
#pragma once

#include <cstdint>

#include "kernels/cpu/cpu_common.h"

namespace zrt::kernels::cpu {

template <typename S>
void swiglu_forward(S* out, const S* gate, const S* up, std::int64_t n);

template <typename S>
void swiglu_backward(S* dgate, S* dup, const S* dout, const S* gate, const S* up, std::int64_t n);

}  // namespace zrt::kernels::cpu
