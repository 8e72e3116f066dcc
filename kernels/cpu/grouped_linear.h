// The experts' projections of a mixture-of-experts layer: E nn.Linear layers without bias, each
// applied to its own block of rows. CPU twin of kernels/cuda/grouped_linear.cu.
//
//   weight: expert e's (OC,IC) nn.Linear weight at weight + e*weight_stride (elements; 0 means
//       OC*IC, a dense (E,OC,IC)). A larger stride takes a slice of each expert's weight:
//       transformers v5's fused gate_up_proj (E,2I,C) is the gate projection at gate_up_proj with
//       OC = I and stride 2I*C, and the up projection at gate_up_proj + I*C with the same stride.
//       dweight is laid out the same way.
//   offsets (E+1), host memory: expert e owns rows [offsets[e], offsets[e+1]) of inp (R,IC) and
//       out (R,OC) (moe_dispatch_plan's offsets, copied to the host); non-decreasing
//   forward:  out[rows of e] = inp[rows of e] @ weight[e]^T                 (OVERWRITES out)
//   backward: dinp[rows of e] += dout[rows of e] @ weight[e]                [= with kOverwrite;
//                                                                            dinp may be null]
//             dweight[e] += dout[rows of e]^T @ inp[rows of e]
// An expert with no rows computes nothing: its dweight is left as it was (a valid zero
// contribution). Each expert is linear_forward / linear_backward (kernels/cpu/linear.h) on its
// rows, so 16-bit storage converts through `ws` (grouped_linear_*_workspace(...) elements,
// sized by the largest expert; 0 for float/double).
#pragma once

#include <cstdint>

#include "kernels/cpu/cpu_common.h"
#include "kernels/grad_write.h"

namespace zrt::kernels::cpu {

template <typename S>
std::int64_t grouped_linear_forward_workspace(const std::int32_t* offsets, int E, int IC, int OC);
template <typename S>
std::int64_t grouped_linear_backward_workspace(const std::int32_t* offsets, int E, int IC, int OC);

template <typename S>
void grouped_linear_forward(S* out, const S* inp, const S* weight, const std::int32_t* offsets,
                            int E, int IC, int OC, acc_t<S>* ws, std::int64_t weight_stride = 0);

template <typename S, typename G>
void grouped_linear_backward(S* dinp, G* dweight, const S* dout, const S* inp, const S* weight,
                             const std::int32_t* offsets, int E, int IC, int OC, acc_t<S>* ws,
                             GradWrite dinp_write = GradWrite::kAccumulate,
                             std::int64_t weight_stride = 0);

}  // namespace zrt::kernels::cpu
