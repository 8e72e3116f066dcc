// Residual add, CPU twin of kernels/cuda/residual.cu.
//
//   forward:  out = a + b
//   backward: da += dout, db += dout   (da and db may be the same array: it then gets 2*dout)
//
// Elementwise over n values.
#pragma once

#include <cstdint>

#include "kernels/cpu/cpu_common.h"

namespace zrt::kernels::cpu {

template <typename S>
void residual_forward(S* out, const S* a, const S* b, std::int64_t n);

template <typename S>
void residual_backward(S* da, S* db, const S* dout, std::int64_t n);

}  // namespace zrt::kernels::cpu
