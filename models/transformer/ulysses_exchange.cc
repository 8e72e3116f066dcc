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

void UlyssesExchange::sum(DevicePtr<float> buf, std::int64_t count) {
  Stream& compute = ctx_.stream();
  Stream& comm = group_.stream();
  packed_->record(compute);
  comm.wait(*packed_);
  group_.all_reduce(buf.as<const std::byte>(), buf.as<std::byte>(), count, DType::kFloat32,
                    ReduceOp::kSum);
  exchanged_->record(comm);
  compute.wait(*exchanged_);
}

void UlyssesExchange::gather(Bytes buf, std::int64_t count, DType dtype) {
  Stream& compute = ctx_.stream();
  Stream& comm = group_.stream();
  packed_->record(compute);
  comm.wait(*packed_);
  const std::int64_t block = count * static_cast<std::int64_t>(dtype_size(dtype));
  group_.all_gather((buf + group_.rank() * block).as<const std::byte>(), buf, count, dtype);
  exchanged_->record(comm);
  compute.wait(*exchanged_);
}

// A whole sequence's layout (B, sp*Tl, Hd, hs) is, at B == 1, the all-to-all's blocks themselves
// (rank j's are tokens [j*Tl, (j+1)*Tl)): sent as it is, or received into, with no copy.
void UlyssesExchange::send_sequence(DType dtype, ConstBytes full, int B, int Tl, int Hd, int hs,
                                    Bytes send, Bytes recv) {
  const std::int64_t count = std::int64_t{B} * Tl * Hd * hs;
  if (B == 1) {
    exchange(full, recv, count, dtype);
    return;
  }
  k::ulysses_scatter_sequence(ctx_, dtype, send, full, size(), B, Tl, Hd, hs);
  exchange(send, recv, count, dtype);
}

void UlyssesExchange::receive_sequence(DType dtype, Bytes full, ConstBytes send, int B, int Tl,
                                       int Hd, int hs, Bytes recv) {
  const std::int64_t count = std::int64_t{B} * Tl * Hd * hs;
  if (B == 1) {
    exchange(send, full, count, dtype);
    return;
  }
  exchange(send, recv, count, dtype);
  k::ulysses_gather_sequence(ctx_, dtype, full, recv, size(), B, Tl, Hd, hs);
}

// The adjoints add into the chunk's gradient; zeroed after the packing (the same compute stream),
// they add into zeros, as into the driver's zeroed chunk gradient: the same bits.
void UlyssesExchange::zero_after_packing(Bytes grad, std::int64_t bytes) {
  ctx_.device().fill_zero(grad, static_cast<std::size_t>(bytes), ctx_.stream());
}

void UlyssesExchange::to_heads(DType dtype, Bytes full, ConstBytes chunk, int B, int Tl,
                               const kernels::UlyssesHeads& heads, int hs, Bytes send, Bytes recv) {
  k::ulysses_scatter_heads(ctx_, dtype, send, chunk, size(), B, Tl, heads, hs);
  receive_sequence(dtype, full, send, B, Tl, heads.block_heads, hs, recv);
}

void UlyssesExchange::to_chunk(DType dtype, Bytes chunk, ConstBytes full, int B, int Tl, int NH,
                               int hs, Bytes send, Bytes recv) {
  const int sp = size();
  const int Hd = NH / sp;
  send_sequence(dtype, full, B, Tl, Hd, hs, send, recv);
  k::ulysses_gather_heads(ctx_, dtype, chunk, recv, sp, B, Tl, Hd, hs);
}

void UlyssesExchange::to_heads_backward(DType dtype, Bytes dchunk, ConstBytes dfull, int B, int Tl,
                                        const kernels::UlyssesHeads& heads, int hs, Bytes send,
                                        Bytes recv) {
  // gather_sequence's adjoint is scatter_sequence; the all-to-all's is itself.
  send_sequence(dtype, dfull, B, Tl, heads.block_heads, hs, send, recv);
  k::ulysses_scatter_heads_backward(ctx_, dtype, dchunk, recv, size(), B, Tl, heads, hs);
}

void UlyssesExchange::to_heads_backward_in_place(DType dtype, Bytes grad, int B, int Tl,
                                                 const kernels::UlyssesHeads& heads, int hs,
                                                 Bytes send, Bytes recv) {
  send_sequence(dtype, grad, B, Tl, heads.block_heads, hs, send, recv);
  zero_after_packing(
      grad, std::int64_t{B} * Tl * heads.heads * hs * static_cast<std::int64_t>(dtype_size(dtype)));
  k::ulysses_scatter_heads_backward(ctx_, dtype, grad, recv, size(), B, Tl, heads, hs);
}

void UlyssesExchange::to_chunk_backward(DType dtype, Bytes dfull, ConstBytes dchunk, int B, int Tl,
                                        int NH, int hs, Bytes send, Bytes recv) {
  const int sp = size();
  // gather_heads's adjoint is scatter_heads over the query heads (group 1).
  k::ulysses_scatter_heads(ctx_, dtype, send, dchunk, sp, B, Tl, k::ulysses_query_heads(NH, sp),
                           hs);
  receive_sequence(dtype, dfull, send, B, Tl, NH / sp, hs, recv);
}

// A packed row (parts, NH, hs) is `parts` rows of NH heads: scattering the heads of B*Tl*parts
// one-token rows sends each rank its heads of every part, ordered (B,Tl,parts,Hd,hs); gathering
// the received chunks as sequences of parts*Hd heads lays them out (B, sp*Tl, parts, Hd, hs).
// One all-to-all moves every part.
void UlyssesExchange::to_heads_packed(DType dtype, Bytes full, ConstBytes chunk, int B, int Tl,
                                      int parts, int NH, int hs, Bytes send, Bytes recv) {
  const int sp = size();
  const k::UlyssesHeads heads = k::ulysses_query_heads(NH, sp);
  k::ulysses_scatter_heads(ctx_, dtype, send, chunk, sp, B * Tl * parts, 1, heads, hs);
  receive_sequence(dtype, full, send, B, Tl, parts * heads.block_heads, hs, recv);
}

void UlyssesExchange::to_heads_packed_backward(DType dtype, Bytes dchunk, ConstBytes dfull, int B,
                                               int Tl, int parts, int NH, int hs, Bytes send,
                                               Bytes recv) {
  const int sp = size();
  const k::UlyssesHeads heads = k::ulysses_query_heads(NH, sp);
  send_sequence(dtype, dfull, B, Tl, parts * heads.block_heads, hs, send, recv);
  k::ulysses_scatter_heads_backward(ctx_, dtype, dchunk, recv, sp, B * Tl * parts, 1, heads, hs);
}

void UlyssesExchange::to_heads_packed_backward_in_place(DType dtype, Bytes grad, int B, int Tl,
                                                        int parts, int NH, int hs, Bytes send,
                                                        Bytes recv) {
  const int sp = size();
  const k::UlyssesHeads heads = k::ulysses_query_heads(NH, sp);
  const int rows = B * Tl * parts;
  send_sequence(dtype, grad, B, Tl, parts * heads.block_heads, hs, send, recv);
  zero_after_packing(grad,
                     std::int64_t{rows} * NH * hs * static_cast<std::int64_t>(dtype_size(dtype)));
  k::ulysses_scatter_heads_backward(ctx_, dtype, grad, recv, sp, rows, 1, heads, hs);
}

}  // namespace zrt::transformer
