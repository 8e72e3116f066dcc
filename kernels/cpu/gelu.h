// GELU, tanh approximation (GPT-2's "gelu_new"), CPU twin of kernels/cuda/gelu.cu.
//
//   forward:  out = 0.5 x (1 + tanh(k (x + 0.044715 x^3))),  k = sqrt(2/pi)
//   backward: dinp += dout * (0.5 (1 + th) + 0.5 x (1 - th^2) k (1 + 3*0.044715 x^2))
//
// Elementwise over n values; dinp must not alias dout. fp32 and 16-bit storage evaluate tanh
// with vec_math.h's vectorized tanh_approx (absolute error < 2e-7); double uses std::tanh.
#pragma once

#include <cstdint>

#include "kernels/cpu/cpu_common.h"

namespace zrt::kernels::cpu {

template <typename S>
void gelu_forward(S* out, const S* inp, std::int64_t n);

template <typename S>
void gelu_backward(S* dinp, const S* inp, const S* dout, std::int64_t n);

}  // namespace zrt::kernels::cpu
