// Linear layer with torch.nn.Linear weights, stored (out, in): CPU twin of
// kernels/cuda/linear.cu (the projections of the Llama family, whose Hugging Face checkpoints
// keep this layout; GPT-2's Conv1D layout is kernels/cpu/matmul.h).
//
//   forward:  out (N,OC) = inp (N,C) @ weight^T + bias (OC)   weight (OC,C) [bias may be null]
//   backward: dinp (N,C)     += dout @ weight                   [= with kOverwrite]
//             dweight (OC,C) += dout^T @ inp
//             dbias (OC)     += column sums of dout (row order)  [dbias may be null]
//
// float/double call BLAS on the arrays directly. 16-bit storage converts the operands to fp32
// in `ws` (linear_*_workspace(...) elements; 0 for float/double, where ws may be null),
// computes in fp32 and rounds each result once.
#pragma once

#include <cstdint>

#include "kernels/cpu/cpu_common.h"
#include "kernels/grad_write.h"

namespace zrt::kernels::cpu {

template <typename S>
std::int64_t linear_forward_workspace(int N, int C, int OC);
template <typename S>
std::int64_t linear_backward_workspace(int N, int C, int OC);

template <typename S>
void linear_forward(S* out, const S* inp, const S* weight, const S* bias, int N, int C, int OC,
                    acc_t<S>* ws);

template <typename S, typename G>
void linear_backward(S* dinp, G* dweight, G* dbias, const S* dout, const S* inp, const S* weight,
                     int N, int C, int OC, acc_t<S>* ws,
                     GradWrite dinp_write = GradWrite::kAccumulate);

}  // namespace zrt::kernels::cpu
