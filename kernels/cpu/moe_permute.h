// Token dispatch and combine of a mixture-of-experts layer: CPU twin of
// kernels/cuda/moe_permute.cu.
//
// N tokens of C channels each choose k experts (experts (N,k) int32 from the router; an entry < 0
// is a slot routed nowhere: it takes no row and adds nothing). The N*k (token, slot) pairs, in the
// order p = n*k + j, are sorted by expert, stably:
//   counts[e]    = the number of pairs choosing expert e                                   (E)
//   offsets[e]   = counts[0] + ... + counts[e-1]; offsets[E] = R, the rows dispatched     (E+1)
//   row_of[n,j]  = offsets[e] + (the number of pairs before n*k+j choosing e), or -1      (N,k)
//   source[r]    = the pair n*k+j whose row is r, for r < R (entries from R on untouched) (N*k)
// so expert e's rows are [offsets[e], offsets[e+1]), in token order.
//
//   gather:            xe[row_of[n,j]] = x[n]                                (xe rows < R written)
//   gather backward:   dx[n] += sum over j = 0..k-1 of dxe[row_of[n,j]]      (one rounding per n)
//   combine:           out[n] = sum over j = 0..k-1 of w[n,j] * y[row_of[n,j]]  (OVERWRITES out;
//                      zero for a token routed nowhere)
//   combine backward:  dy[row_of[n,j]] = w[n,j] * dout[n]              (OVERWRITES dy rows < R)
//                      dw[n,j] = dot(dout[n], y[row_of[n,j]]), 0 for -1      (OVERWRITES dw)
// Sums run in acc_t<S> in slot order j = 0..k-1 (and channel order in dot), so each result is the
// same bits on every run and thread count. w and dw are acc_t<S> (fp32; double for the
// finite-difference checks). Expert indices >= E throw InvalidArgument.
#pragma once

#include <cstdint>

#include "kernels/cpu/cpu_common.h"

namespace zrt::kernels::cpu {

void moe_dispatch_plan(std::int32_t* counts, std::int32_t* offsets, std::int32_t* row_of,
                       std::int32_t* source, const std::int32_t* experts, int N, int k, int E);

template <typename S>
void moe_gather(S* xe, const S* x, const std::int32_t* row_of, int N, int k, int C);
template <typename S>
void moe_gather_backward(S* dx, const S* dxe, const std::int32_t* row_of, int N, int k, int C);

template <typename S>
void moe_combine(S* out, const S* y, const acc_t<S>* w, const std::int32_t* row_of, int N, int k,
                 int C);
template <typename S>
void moe_combine_backward(S* dy, acc_t<S>* dw, const S* dout, const S* y, const acc_t<S>* w,
                          const std::int32_t* row_of, int N, int k, int C);

}  // namespace zrt::kernels::cpu
