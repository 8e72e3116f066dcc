// Matmul + bias with Hugging Face Conv1D weights, stored (in, out): CPU twin of
// kernels/cuda/matmul.cu.
//
//   forward:  out (N,OC) = inp (N,C) @ weight (C,OC) + bias (OC)      [bias may be null]
//   backward: dinp (N,C)     += dout @ weight^T                     [dinp may be null;
//                                                                    = with kOverwrite]
//             dweight (C,OC) += inp^T @ dout
//             dbias (OC)     += column sums of dout (row order)     [dbias may be null]
//
// float/double call BLAS on the arrays directly. 16-bit storage converts the operands to fp32
// in `ws` (matmul_*_workspace(...) floats; 0 for float/double, where ws may be null), computes
// in fp32 and rounds each result once.
#pragma once

#include <cstdint>

#include "kernels/cpu/cpu_common.h"
#include "kernels/grad_write.h"

namespace zrt::kernels::cpu {

template <typename S>
std::int64_t matmul_forward_workspace(int N, int C, int OC);
template <typename S>
std::int64_t matmul_backward_workspace(int N, int C, int OC);

template <typename S>
void matmul_forward(S* out, const S* inp, const S* weight, const S* bias, int N, int C, int OC,
                    acc_t<S>* ws);

template <typename S, typename G>
void matmul_backward(S* dinp, G* dweight, G* dbias, const S* dout, const S* inp, const S* weight,
                     int N, int C, int OC, acc_t<S>* ws,
                     GradWrite dinp_write = GradWrite::kAccumulate);

// The shared body of matmul_* (Conv1D weights (in, out): kInOut) and linear_* (nn.Linear
// weights (out, in): kOutIn, kernels/cpu/linear.h); ws as matmul_*_workspace.
enum class WeightLayout { kInOut, kOutIn };
template <typename S>
void dense_forward(S* out, const S* inp, const S* weight, const S* bias, int N, int C, int OC,
                   acc_t<S>* ws, WeightLayout layout);
template <typename S, typename G>
void dense_backward(S* dinp, G* dweight, G* dbias, const S* dout, const S* inp, const S* weight,
                    int N, int C, int OC, acc_t<S>* ws, WeightLayout layout,
                    GradWrite dinp_write = GradWrite::kAccumulate);

// dbias[c] += sum over rows n of dout[n,c] (N rows of C), summed in row order; shared with the
// attention and classifier layers.
template <typename S, typename G>
void bias_backward(G* dbias, const S* dout, int N, int C);

}  // namespace zrt::kernels::cpu
