// Device-dispatching entry points of Ulysses sequence parallelism's layout changes (what a
// model calls around the all-to-alls that turn sequence chunks into head shares and back).
// Shapes, the head map and the adjoints: kernels/cpu/ulysses_layout.h. Stream-ordered and
// asynchronous like every op in kernels/ops.h; pure data movement (exact), except that
// ulysses_scatter_heads_backward ACCUMULATES into din (the copies of a key/value head that
// several ranks received are summed in fp32 in ascending rank order, then rounded once).
#pragma once

#include "kernels/ops.h"

namespace zrt::kernels {

// How the heads of one projection are shared out over an sp group of ranks.
struct UlyssesHeads {
  int heads = 0;           // H: the heads this projection has (NH for q, NKV for k and v)
  int block_heads = 0;     // Hd: the heads each rank receives
  int heads_per_rank = 0;  // NH / sp: the query heads each rank attends with
  int group = 1;           // NH / H: query heads per key/value head (1 for q)
};

// The split of query heads (NH) or key/value heads (NKV of NH) over sp ranks. Throws
// InvalidArgument unless sp divides NH and, for key/value heads, NKV divides sp or sp divides
// NKV (then every rank receives whole heads, copies when NKV < sp).
UlyssesHeads ulysses_query_heads(int NH, int sp);
UlyssesHeads ulysses_kv_heads(int NH, int NKV, int sp);

// in (B,Tl,H,hs) -> out (sp,B,Tl,Hd,hs): block j = the heads rank j attends with.
void ulysses_scatter_heads(KernelContext& ctx, DType dtype, Bytes out, ConstBytes in, int sp, int B,
                           int Tl, const UlyssesHeads& heads, int hs);
// din (B,Tl,H,hs) += the adjoint of ulysses_scatter_heads applied to dout (sp,B,Tl,Hd,hs).
void ulysses_scatter_heads_backward(KernelContext& ctx, DType dtype, Bytes din, ConstBytes dout,
                                    int sp, int B, int Tl, const UlyssesHeads& heads, int hs);
// in (sp,B,Tl,Hd,hs) -> out (B,sp*Tl,Hd,hs): the received chunks as whole sequences.
void ulysses_gather_sequence(KernelContext& ctx, DType dtype, Bytes out, ConstBytes in, int sp,
                             int B, int Tl, int Hd, int hs);
// in (B,sp*Tl,Hd,hs) -> out (sp,B,Tl,Hd,hs): whole sequences cut into the chunks to send back.
void ulysses_scatter_sequence(KernelContext& ctx, DType dtype, Bytes out, ConstBytes in, int sp,
                              int B, int Tl, int Hd, int hs);
// in (sp,B,Tl,Hd,hs) -> out (B,Tl,sp*Hd,hs): every rank's heads of this rank's chunk.
void ulysses_gather_heads(KernelContext& ctx, DType dtype, Bytes out, ConstBytes in, int sp, int B,
                          int Tl, int Hd, int hs);

}  // namespace zrt::kernels
