#include "models/transformer/ulysses_exchange.h"

#include "runtime/common/error.h"

namespace zrt::transformer {

namespace k = zrt::kernels;

UlyssesExchange::UlyssesExchange(kernels::KernelContext& ctx, ProcessGroup& group)
    : ctx_(ctx),
      group_(group),
      packed_(ctx.device().create_event()),
      exchanged_(ctx.device().create_event()) {}

std::int64_t UlyssesExchange::scratch_elements(int B, int Tl, const kernels::UlyssesHeads& heads,
                                               int hs) const {
  return std::int64_t{size()} * B * Tl * heads.block_heads * hs;
}

void UlyssesExchange::exchange(ConstBytes send, Bytes recv, std::int64_t count, DType dtype) {
  Stream& compute = ctx_.stream();
  Stream& comm = group_.stream();
  packed_->record(compute);
  comm.wait(*packed_);
  group_.all_to_all(send, recv, count, dtype);
  exchanged_->record(comm);
  compute.wait(*exchanged_);
}

// The adjoints add into the chunk's gradient; zeroed after the packing (the same compute stream),
// they add into zeros, as into the driver's zeroed chunk gradient: the same bits.
void UlyssesExchange::zero_after_packing(Bytes grad, std::int64_t bytes) {
  ctx_.device().fill_zero(grad, static_cast<std::size_t>(bytes), ctx_.stream());
}

void UlyssesExchange::to_heads(DType dtype, Bytes full, ConstBytes chunk, int B, int Tl,
                               const kernels::UlyssesHeads& heads, int hs, Bytes send, Bytes recv) {
  const int sp = size();
  k::ulysses_scatter_heads(ctx_, dtype, send, chunk, sp, B, Tl, heads, hs);
  exchange(send, recv, std::int64_t{B} * Tl * heads.block_heads * hs, dtype);
  k::ulysses_gather_sequence(ctx_, dtype, full, recv, sp, B, Tl, heads.block_heads, hs);
}

void UlyssesExchange::to_chunk(DType dtype, Bytes chunk, ConstBytes full, int B, int Tl, int NH,
                               int hs, Bytes send, Bytes recv) {
  const int sp = size();
  const int Hd = NH / sp;
  k::ulysses_scatter_sequence(ctx_, dtype, send, full, sp, B, Tl, Hd, hs);
  exchange(send, recv, std::int64_t{B} * Tl * Hd * hs, dtype);
  k::ulysses_gather_heads(ctx_, dtype, chunk, recv, sp, B, Tl, Hd, hs);
}

void UlyssesExchange::to_heads_backward(DType dtype, Bytes dchunk, ConstBytes dfull, int B, int Tl,
                                        const kernels::UlyssesHeads& heads, int hs, Bytes send,
                                        Bytes recv) {
  const int sp = size();
  // gather_sequence's adjoint is scatter_sequence; the all-to-all's is itself.
  k::ulysses_scatter_sequence(ctx_, dtype, send, dfull, sp, B, Tl, heads.block_heads, hs);
  exchange(send, recv, std::int64_t{B} * Tl * heads.block_heads * hs, dtype);
  k::ulysses_scatter_heads_backward(ctx_, dtype, dchunk, recv, sp, B, Tl, heads, hs);
}

void UlyssesExchange::to_heads_backward_in_place(DType dtype, Bytes grad, int B, int Tl,
                                                 const kernels::UlyssesHeads& heads, int hs,
                                                 Bytes send, Bytes recv) {
  const int sp = size();
  k::ulysses_scatter_sequence(ctx_, dtype, send, grad, sp, B, Tl, heads.block_heads, hs);
  exchange(send, recv, std::int64_t{B} * Tl * heads.block_heads * hs, dtype);
  zero_after_packing(
      grad, std::int64_t{B} * Tl * heads.heads * hs * static_cast<std::int64_t>(dtype_size(dtype)));
  k::ulysses_scatter_heads_backward(ctx_, dtype, grad, recv, sp, B, Tl, heads, hs);
}

void UlyssesExchange::to_chunk_backward(DType dtype, Bytes dfull, ConstBytes dchunk, int B, int Tl,
                                        int NH, int hs, Bytes send, Bytes recv) {
  const int sp = size();
  const int Hd = NH / sp;
  // gather_heads's adjoint is scatter_heads over the query heads (group 1).
  k::ulysses_scatter_heads(ctx_, dtype, send, dchunk, sp, B, Tl, k::ulysses_query_heads(NH, sp),
                           hs);
  exchange(send, recv, std::int64_t{B} * Tl * Hd * hs, dtype);
  k::ulysses_gather_sequence(ctx_, dtype, dfull, recv, sp, B, Tl, Hd, hs);
}

// A packed row (parts, NH, hs) is `parts` rows of NH heads: scattering the heads of B*Tl*parts
// one-token rows sends each rank its heads of every part, ordered (B,Tl,parts,Hd,hs); gathering
// the received chunks as sequences of parts*Hd heads lays them out (B, sp*Tl, parts, Hd, hs).
// One all-to-all moves every part.
void UlyssesExchange::to_heads_packed(DType dtype, Bytes full, ConstBytes chunk, int B, int Tl,
                                      int parts, int NH, int hs, Bytes send, Bytes recv) {
  const int sp = size();
  const k::UlyssesHeads heads = k::ulysses_query_heads(NH, sp);
  const int rows = B * Tl * parts;
  k::ulysses_scatter_heads(ctx_, dtype, send, chunk, sp, rows, 1, heads, hs);
  exchange(send, recv, std::int64_t{rows} * heads.block_heads * hs, dtype);
  k::ulysses_gather_sequence(ctx_, dtype, full, recv, sp, B, Tl, parts * heads.block_heads, hs);
}

void UlyssesExchange::to_heads_packed_backward(DType dtype, Bytes dchunk, ConstBytes dfull, int B,
                                               int Tl, int parts, int NH, int hs, Bytes send,
                                               Bytes recv) {
  const int sp = size();
  const k::UlyssesHeads heads = k::ulysses_query_heads(NH, sp);
  const int rows = B * Tl * parts;
  k::ulysses_scatter_sequence(ctx_, dtype, send, dfull, sp, B, Tl, parts * heads.block_heads, hs);
  exchange(send, recv, std::int64_t{rows} * heads.block_heads * hs, dtype);
  k::ulysses_scatter_heads_backward(ctx_, dtype, dchunk, recv, sp, rows, 1, heads, hs);
}

void UlyssesExchange::to_heads_packed_backward_in_place(DType dtype, Bytes grad, int B, int Tl,
                                                        int parts, int NH, int hs, Bytes send,
                                                        Bytes recv) {
  const int sp = size();
  const k::UlyssesHeads heads = k::ulysses_query_heads(NH, sp);
  const int rows = B * Tl * parts;
  k::ulysses_scatter_sequence(ctx_, dtype, send, grad, sp, B, Tl, parts * heads.block_heads, hs);
  exchange(send, recv, std::int64_t{rows} * heads.block_heads * hs, dtype);
  zero_after_packing(grad,
                     std::int64_t{rows} * NH * hs * static_cast<std::int64_t>(dtype_size(dtype)));
  k::ulysses_scatter_heads_backward(ctx_, dtype, grad, recv, sp, rows, 1, heads, hs);
}

}  // namespace zrt::transformer
