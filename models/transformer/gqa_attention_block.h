// The grouped-query attention of the Llama-family blocks (Llama, Qwen2, Mistral and the mixtures
// of experts), shared so that every model of the family runs it the same way, with or without
// Ulysses sequence parallelism.
//
// At sp 1 it is kernels::gqa_attention_* over the pass's rows. Under sequence parallelism (sp
// ranks, each holding a chunk of Tl tokens of every sequence) the chunk's q, k, v become this
// rank's heads of the whole sequence through the sp group's all-to-alls (UlyssesExchange), in
// place in their buffers, the attention runs over the whole sequences (doc_start spans them), and
// its output goes back to every head of the chunk; the backward runs the adjoints, the copies of a
// key/value head that several ranks received summed. How the heads are shared out: GqaHeads.
// The passes are TransformerModel::gqa_attention_forward / _backward (transformer_model.h: they
// use the pass and the exchange the driver owns), defined in gqa_attention_block.cc.
#pragma once

#include <cstdint>

#include "kernels/ulysses_ops.h"
#include "models/activation_planner.h"
#include "models/transformer/transformer_activations.h"

namespace zrt::transformer {

// A block's attention heads and how sequence parallelism shares them out.
struct GqaHeads {
  int NH = 0, NKV = 0, hd = 0;  // query heads, key/value heads, head_dim
  int sp = 1;
  // sp > 1: this rank's query heads and key/value heads of the whole sequence (ulysses_ops.h;
  // with fewer key/value heads than ranks a rank receives a copy of its group's head).
  kernels::UlyssesHeads q_heads, kv_heads;
  // The width per chunk token of this rank's whole-sequence k and v (sp * kv_heads.block_heads
  // * hd; NKV * hd at sp 1): the row width k, v, dk and dv are planned at.
  int KV_full = 0;
  int Q() const { return NH * hd; }
  int KV() const { return NKV * hd; }
};
GqaHeads gqa_heads(int num_attention_heads, int num_key_value_heads, int head_dim, int sp);

// Under sequence parallelism, plans the all-to-alls' send and recv buffers of a pass of shape `s`
// (N * max(Q, KV_full) elements each; one buffer for both at B == 1, where each exchange uses
// only one of them: ulysses_exchange.h). Nothing at sp 1.
void plan_gqa_exchange(ActivationPlanner& p, const GqaHeads& heads, const PassShape& s,
                       DevicePtr<std::byte>* send, DevicePtr<std::byte>* recv);

}  // namespace zrt::transformer
