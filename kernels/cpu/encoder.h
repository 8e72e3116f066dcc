// Token + position embedding (GPT-2's wte/wpe lookup), CPU twin of kernels/cuda/encoder.cu.
//
//   forward:  out[b,t,:] = wte[tokens[b,t],:] + wpe[pos(b,t),:]
//   backward: dwte[v,:] += sum of dout[b,t,:] over the (b,t) with tokens[b,t] == v
//             dwpe[p,:] += sum of dout[b,t,:] over the (b,t) with pos(b,t) == p
// pos(b,t) = positions[b*T+t] (packed documents: positions restart at 0 in each document; a
// sequence-parallel chunk: its tokens' positions in the whole sequence), or t when positions is
// null.
//
// Shapes: tokens (B,T) int32 in [0,V); wte (V,C); wpe (P,C) with P = position_rows, or T where
// position_rows is 0 (P >= T without positions); out, dout (B,T,C). wpe and
// dwpe may be null: no position term (the Llama family, whose positions come from RoPE).
// The backward sums each token's rows in (b,t) order into an acc_t accumulator and adds it to
// dwte once, and each position's rows into dwpe the same way (without positions: over b for each
// t, the same order), so the result does not depend on the thread count (the CUDA twin uses the
// same order). Token ids out of range, and positions outside [0, P), throw InvalidArgument.
#pragma once

#include <cstdint>

#include "kernels/cpu/cpu_common.h"

namespace zrt::kernels::cpu {

template <typename S>
void encoder_forward(S* out, const std::int32_t* tokens, const S* wte, const S* wpe, int B, int T,
                     int C, int V, const std::int32_t* positions = nullptr, int position_rows = 0);

template <typename S, typename G>
void encoder_backward(G* dwte, G* dwpe, const S* dout, const std::int32_t* tokens, int B, int T,
                      int C, int V, const std::int32_t* positions = nullptr, int position_rows = 0);

}  // namespace zrt::kernels::cpu
