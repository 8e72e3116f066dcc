#include "models/transformer/gqa_attention_block.h"

#include <algorithm>

#include "kernels/ops.h"
#include "models/transformer/transformer_model.h"

namespace zrt::transformer {

namespace k = zrt::kernels;

GqaHeads gqa_heads(int num_attention_heads, int num_key_value_heads, int head_dim, int sp) {
  GqaHeads h;
  h.NH = num_attention_heads;
  h.NKV = num_key_value_heads;
  h.hd = head_dim;
  h.sp = sp;
  if (sp > 1) {
    h.q_heads = k::ulysses_query_heads(num_attention_heads, sp);
    h.kv_heads = k::ulysses_kv_heads(num_attention_heads, num_key_value_heads, sp);
    h.KV_full = sp * h.kv_heads.block_heads * head_dim;
  } else {
    h.KV_full = num_key_value_heads * head_dim;
  }
  return h;
}

void plan_gqa_exchange(ActivationPlanner& p, const GqaHeads& heads, const PassShape& s,
                       DevicePtr<std::byte>* send, DevicePtr<std::byte>* recv) {
  if (heads.sp <= 1) return;
  const std::int64_t exchanged = s.N() * std::max<std::int64_t>(heads.Q(), heads.KV_full) * s.S;
  p.bytes(send, exchanged);
  if (s.B == 1) {
    p.alias(recv, send);
  } else {
    p.bytes(recv, exchanged);
  }
}

void TransformerModel::gqa_attention_forward(const GqaHeads& h, const GqaTensors& x, Bytes send,
                                             Bytes recv, int window) {
  const Pass& p = pass();
  UlyssesExchange* ex = ulysses();
  if (ex == nullptr) {
    k::gqa_attention_forward(ctx(), p.dtype, x.atty, x.lse, x.q, x.k, x.v, p.B, p.T, h.NH, h.NKV,
                             h.hd, p.doc_start, window);
    return;
  }
  // Chunks to head shares of the whole sequences, attention over them with this rank's heads
  // (doc_start spans the whole sequences, and a window counts whole-sequence positions), and the
  // output back to every head of the chunk.
  ex->to_heads(p.dtype, x.q, x.q, p.B, p.T, h.q_heads, h.hd, send, recv);
  ex->to_heads(p.dtype, x.k, x.k, p.B, p.T, h.kv_heads, h.hd, send, recv);
  ex->to_heads(p.dtype, x.v, x.v, p.B, p.T, h.kv_heads, h.hd, send, recv);
  k::gqa_attention_forward(ctx(), p.dtype, x.atty_full, x.lse, x.q, x.k, x.v, p.B,
                           p.sequence_length(), h.q_heads.block_heads, h.kv_heads.block_heads, h.hd,
                           p.doc_start, window);
  ex->to_chunk(p.dtype, x.atty, x.atty_full, p.B, p.T, h.NH, h.hd, send, recv);
}

void TransformerModel::gqa_attention_backward(const GqaHeads& h, const GqaTensors& x,
                                              const GqaGradients& d, Bytes send, Bytes recv,
                                              int window) {
  const Pass& p = pass();
  UlyssesExchange* ex = ulysses();
  if (ex == nullptr) {
    // dq, dk, dv were zeroed by the driver with the accumulated region: kIntoZeros lets cuDNN's
    // attention write them in place (the CPU backend checks the zeros).
    k::gqa_attention_backward(ctx(), p.dtype, d.dq, d.dk, d.dv, d.datty, x.q, x.k, x.v, x.atty,
                              x.lse, p.B, p.T, h.NH, h.NKV, h.hd, p.doc_start, window,
                              k::GradWrite::kIntoZeros);
    return;
  }
  // Each buffer changes layout in place: datty from the chunk's every head to this rank's heads
  // of the whole sequence; dq, dk, dv (zeroed by the driver with the accumulated region) receive
  // attention's gradients in the whole sequence's layout, then each adjoint turns them into the
  // chunk's (the copies of a shared key/value head summed).
  ex->to_chunk_backward(p.dtype, d.datty, d.datty, p.B, p.T, h.NH, h.hd, send, recv);
  k::gqa_attention_backward(ctx(), p.dtype, d.dq, d.dk, d.dv, d.datty, x.q, x.k, x.v, x.atty_full,
                            x.lse, p.B, p.sequence_length(), h.q_heads.block_heads,
                            h.kv_heads.block_heads, h.hd, p.doc_start, window,
                            k::GradWrite::kIntoZeros);
  ex->to_heads_backward_in_place(p.dtype, d.dq, p.B, p.T, h.q_heads, h.hd, send, recv);
  ex->to_heads_backward_in_place(p.dtype, d.dk, p.B, p.T, h.kv_heads, h.hd, send, recv);
  ex->to_heads_backward_in_place(p.dtype, d.dv, p.B, p.T, h.kv_heads, h.hd, send, recv);
}

}  // namespace zrt::transformer
