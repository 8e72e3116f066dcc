// RMSNorm over the last dimension (Llama's, eps from config.json's rms_norm_eps), CPU twin of
// kernels/cuda/rmsnorm.cu.
//
//   forward:  rstd[n] = 1/sqrt(sum_c x^2/C + eps),  out[n,c] = x[n,c] * rstd[n] * weight[c]
//   backward: with norm = x*rstd and g = dout*weight,
//             dinp[n,c]  += (g - norm * mean_c(g*norm)) * rstd[n]
//             dweight[c] += sum_n dout*norm
//
// Shapes: inp, out, dout, dinp (N,C); weight (C); rstd (N) in acc_t<S>. dinp may alias nothing
// else. Rows are independent (parallel over rows); dweight is a column sum in row order,
// parallel over channels, so results do not depend on the thread count. A null dweight (a
// frozen weight) skips the column sums.
#pragma once

#include "kernels/cpu/cpu_common.h"

namespace zrt::kernels::cpu {

template <typename S>
void rmsnorm_forward(S* out, acc_t<S>* rstd, const S* inp, const S* weight, int N, int C,
                     double eps);

template <typename S, typename G>
void rmsnorm_backward(S* dinp, G* dweight, const S* dout, const S* inp, const S* weight,
                      const acc_t<S>* rstd, int N, int C);

}  // namespace zrt::kernels::cpu
