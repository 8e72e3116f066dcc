// Ulysses sequence parallelism's layout changes around attention, CPU twin of
// kernels/cuda/ulysses_layout.cu. Pure data movement: results are exact in every dtype.
//
// An sp group of ranks holds each sequence in sp consecutive chunks of Tl tokens (rank j holds
// tokens [j*Tl, (j+1)*Tl)). Attention needs whole sequences, so an all-to-all over the group
// trades sequence chunks for heads: before it each rank has all heads of its chunk, after it a
// share of the heads of the whole sequence. The all-to-all moves blocks: block j of a rank's
// send buffer goes to rank j, block i of its receive buffer came from rank i. These functions
// build the send buffers and unpack the receive buffers. Shapes (row-major, hs innermost):
//
//   scatter_heads     in (B,Tl,H,hs)      -> out (sp,B,Tl,Hd,hs)
//                     out[j][b][t][h] = in[b][t][first(j) + h],  first(j) = (j*hpr) / group
//     Query heads: H = NH, Hd = hpr = NH/sp, group = 1 (rank j gets heads [j*Hd, (j+1)*Hd)).
//     Key/value heads: H = NKV, hpr = NH/sp, group = NH/NKV: rank j gets the key/value heads its
//     query heads use, Hd = max(1, NKV/sp) of them; with NKV < sp several ranks get a copy of the
//     same head (the caller checks that NKV divides sp or sp divides NKV).
//   scatter_heads_backward   din (B,Tl,H,hs) += the sum over j of the copies dout[j] holds, j in
//                     ascending order (the same bits on every run).
//   gather_sequence   in (sp,B,Tl,Hd,hs)  -> out (B,sp*Tl,Hd,hs): out[b][i*Tl+t] = in[i][b][t]
//   scatter_sequence  in (B,sp*Tl,Hd,hs)  -> out (sp,B,Tl,Hd,hs): the inverse of gather_sequence
//   gather_heads      in (sp,B,Tl,Hd,hs)  -> out (B,Tl,sp*Hd,hs): out[b][t][i*Hd+h] =
//   in[i][b][t][h]
//
// Forward: q, k, v go scatter_heads -> all-to-all -> gather_sequence; attention's output goes
// scatter_sequence -> all-to-all -> gather_heads. Each backward runs the adjoint of its forward
// in reverse order: gather_sequence and scatter_sequence are each other's adjoint (and
// inverse), gather_heads's adjoint is scatter_heads with group 1, scatter_heads's adjoint is
// scatter_heads_backward. Every function but scatter_heads_backward overwrites `out`.
#pragma once

#include <cstdint>

#include "kernels/cpu/cpu_common.h"

namespace zrt::kernels::cpu {

// The first head of block j (see above).
inline int ulysses_first_head(int j, int heads_per_rank, int group) {
  return static_cast<int>((std::int64_t{j} * heads_per_rank) / group);
}

template <typename S>
void ulysses_scatter_heads(S* out, const S* in, int sp, int B, int Tl, int H, int Hd, int hs,
                           int heads_per_rank, int group);
template <typename S>
void ulysses_scatter_heads_backward(S* din, const S* dout, int sp, int B, int Tl, int H, int Hd,
                                    int hs, int heads_per_rank, int group);
template <typename S>
void ulysses_gather_sequence(S* out, const S* in, int sp, int B, int Tl, int Hd, int hs);
template <typename S>
void ulysses_scatter_sequence(S* out, const S* in, int sp, int B, int Tl, int Hd, int hs);
template <typename S>
void ulysses_gather_heads(S* out, const S* in, int sp, int B, int Tl, int Hd, int hs);

}  // namespace zrt::kernels::cpu
