// LayerNorm over the last dimension (eps 1e-5, as GPT-2), CPU twin of kernels/cuda/layernorm.cu.
//
//   forward:  mean[n] = sum_c x/C, rstd[n] = 1/sqrt(sum_c (x-mean)^2/C + eps)
//             out[n,c] = (x[n,c]-mean[n]) * rstd[n] * weight[c] + bias[c]
//   backward: with norm = (x-mean)*rstd and g = dout*weight,
//             dinp[n,c]  += (g - mean_c(g) - norm * mean_c(g*norm)) * rstd[n]
//             dweight[c] += sum_n dout*norm,  dbias[c] += sum_n dout
//
// Shapes: inp, out, dout, dinp (N,C); weight, bias (C); mean, rstd (N) in acc_t<S>.
// dinp may alias nothing else. Rows are independent (parallel over rows); the parameter
// gradients are column sums over rows in row order, parallel over channels; either may be null
// (a frozen weight or bias: not computed).
#pragma once

#include "kernels/cpu/cpu_common.h"

namespace zrt::kernels::cpu {

constexpr double kLayerNormEps = 1e-5;

template <typename S>
void layernorm_forward(S* out, acc_t<S>* mean, acc_t<S>* rstd, const S* inp, const S* weight,
                       const S* bias, int N, int C);

template <typename S, typename G>
void layernorm_backward(S* dinp, G* dweight, G* dbias, const S* dout, const S* inp, const S* weight,
                        const acc_t<S>* mean, const acc_t<S>* rstd, int N, int C);

}  // namespace zrt::kernels::cpu
