// UlyssesExchange: the two layout changes of Ulysses sequence parallelism around attention, each
// an all-to-all over the sequence-parallel group between two of kernels/ulysses_ops.h's packing
// steps, and their adjoints for the backward.
//
// An sp group of ranks holds each sequence in sp consecutive chunks of Tl tokens (group rank j:
// tokens [j*Tl, (j+1)*Tl)). Before attention, to_heads() turns this rank's chunk of q, k or v
// (B,Tl,H,hs) into its share of the heads over the whole sequence (B,sp*Tl,Hd,hs); after it,
// to_chunk() turns the attention's output (B,sp*Tl,NH/sp,hs) back into every head of this
// rank's chunk (B,Tl,NH,hs). to_heads_backward() and to_chunk_backward() are their adjoints
// (an all-to-all is its own adjoint: it only moves blocks). to_heads_packed() does to_heads for
// projections packed side by side in one tensor (GPT-2's c_attn: q, k, v of every head in each
// token's row) in one all-to-all, and keeps them packed: the attention reads them as it would at
// sp 1, with NH/sp heads.
//
// At B == 1 a sequence's whole layout is the all-to-all's block order itself (group rank j's
// tokens are block j), so that side of an exchange needs no packing step: each call then uses
// only one of its send and receive buffers (to_heads and to_chunk_backward send, the others
// recv), and the caller may pass one buffer as both.
//
// Ordering: the packing kernels run on the model's compute stream, the all-to-all on the group's
// own stream (ParallelLayout::sequence_group). The compute stream records `packed` after
// packing; the group's stream waits for it, runs the all-to-all and records `exchanged`; the
// compute stream waits for that before unpacking. The compute stream's later writes into the send
// buffer are ordered after `exchanged` too, so the buffers are reused safely. The host never
// waits.
//
// Not thread-safe; the model's one thread uses it. The group, the context and the buffers must
// outlive every call's work.
#pragma once

#include <memory>

#include "kernels/kernel_context.h"
#include "kernels/ulysses_ops.h"
#include "runtime/comm/process_group.h"

namespace zrt::transformer {

class UlyssesExchange {
 public:
  using Bytes = DevicePtr<std::byte>;
  using ConstBytes = DevicePtr<const std::byte>;

  UlyssesExchange(kernels::KernelContext& ctx, ProcessGroup& group);

  int size() const { return group_.size(); }
  int rank() const { return group_.rank(); }

  // The scratch one exchange of `heads` needs in each of its send and receive buffers, in
  // elements: sp * B * Tl * heads.block_heads * hs.
  std::int64_t scratch_elements(int B, int Tl, const kernels::UlyssesHeads& heads, int hs) const;

  // full (B, sp*Tl, heads.block_heads, hs) = this rank's heads of the whole sequence, from every
  // rank's chunk (B,Tl,heads.heads,hs) (`chunk` is this rank's). `full` may be `chunk` (a buffer
  // sized for the larger): the chunk is read into `send` before `full` is written.
  void to_heads(DType dtype, Bytes full, ConstBytes chunk, int B, int Tl,
                const kernels::UlyssesHeads& heads, int hs, Bytes send, Bytes recv);
  // chunk (B,Tl,NH,hs) = every rank's heads of this rank's chunk, from each rank's attention output
  // full (B, sp*Tl, NH/sp, hs).
  void to_chunk(DType dtype, Bytes chunk, ConstBytes full, int B, int Tl, int NH, int hs,
                Bytes send, Bytes recv);
  // dchunk (B,Tl,heads.heads,hs) += the adjoint of to_heads applied to dfull (the copies of a
  // key/value head that several ranks received are summed).
  void to_heads_backward(DType dtype, Bytes dchunk, ConstBytes dfull, int B, int Tl,
                         const kernels::UlyssesHeads& heads, int hs, Bytes send, Bytes recv);
  // to_heads_backward into a zeroed chunk, in one buffer: `grad` holds dfull (B, sp*Tl,
  // heads.block_heads, hs) on entry and the chunk's gradient (B,Tl,heads.heads,hs) on exit, the
  // same bits as to_heads_backward into a zeroed dchunk. dfull is read into `send`, then the
  // chunk's part of `grad` is zeroed and accumulated into.
  void to_heads_backward_in_place(DType dtype, Bytes grad, int B, int Tl,
                                  const kernels::UlyssesHeads& heads, int hs, Bytes send,
                                  Bytes recv);
  // dfull (B, sp*Tl, NH/sp, hs) = the adjoint of to_chunk applied to dchunk (B,Tl,NH,hs). `dfull`
  // may be `dchunk` (both are B*Tl*NH*hs elements): dchunk is read into `send` first.
  void to_chunk_backward(DType dtype, Bytes dfull, ConstBytes dchunk, int B, int Tl, int NH, int hs,
                         Bytes send, Bytes recv);

  // buf (count fp32 values) = its sum over the group's ranks, in place, ordered on the compute
  // stream as the exchanges are: statistics over a forward's tokens, which the group's ranks
  // hold a chunk each of (a mixture of experts' load-balancing counts).
  void sum(DevicePtr<float> buf, std::int64_t count);
  // buf (group size x count elements of `dtype`) = every rank's block, in place: this rank's
  // block [rank*count, (rank+1)*count) is its own on entry. Ordered as sum() (a capacity's
  // routing counts, which every rank of the group needs).
  void gather(Bytes buf, std::int64_t count, DType dtype);

  // Packed projections: chunk (B,Tl,parts,NH,hs), `parts` projections of NH heads side by side
  // in each token's row (GPT-2's qkv: parts 3). full (B, sp*Tl, parts, NH/sp, hs) = this rank's
  // query heads (ulysses_query_heads) of every part over the whole sequence, still packed. send
  // and recv hold B * Tl * parts * NH * hs elements each. `full` may be `chunk`.
  void to_heads_packed(DType dtype, Bytes full, ConstBytes chunk, int B, int Tl, int parts, int NH,
                       int hs, Bytes send, Bytes recv);
  // dchunk (B,Tl,parts,NH,hs) += the adjoint of to_heads_packed applied to dfull
  // (B, sp*Tl, parts, NH/sp, hs).
  void to_heads_packed_backward(DType dtype, Bytes dchunk, ConstBytes dfull, int B, int Tl,
                                int parts, int NH, int hs, Bytes send, Bytes recv);
  // to_heads_packed_backward into a zeroed chunk, in one buffer (as to_heads_backward_in_place):
  // `grad` holds dfull on entry and dchunk on exit (both B*Tl*parts*NH*hs elements).
  void to_heads_packed_backward_in_place(DType dtype, Bytes grad, int B, int Tl, int parts, int NH,
                                         int hs, Bytes send, Bytes recv);

 private:
  // recv = the all-to-all of send (blocks of `count` elements), ordered as the top says.
  void exchange(ConstBytes send, Bytes recv, std::int64_t count, DType dtype);
  // recv = the all-to-all of the whole sequence's layout `full` (B, sp*Tl, Hd, hs), packed into
  // send first, or sent as it is at B == 1.
  void send_sequence(DType dtype, ConstBytes full, int B, int Tl, int Hd, int hs, Bytes send,
                     Bytes recv);
  // full (B, sp*Tl, Hd, hs) = the all-to-all of send, through recv, or received into full itself
  // at B == 1.
  void receive_sequence(DType dtype, Bytes full, ConstBytes send, int B, int Tl, int Hd, int hs,
                        Bytes recv);
  // Zeroes `bytes` of `grad` on the compute stream, after the packing that read it into send.
  void zero_after_packing(Bytes grad, std::int64_t bytes);

  kernels::KernelContext& ctx_;
  ProcessGroup& group_;
  std::unique_ptr<Event> packed_;
  std::unique_ptr<Event> exchanged_;
};

}  // namespace zrt::transformer
