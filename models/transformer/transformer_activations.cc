#include "models/transformer/transformer_activations.h"

#include <algorithm>

#include "kernels/ops.h"
#include "models/transformer/checkpoint_offload.h"
#include "models/transformer/tiling.h"

namespace zrt::transformer {

KeptSets kept_sets(int n_layer, bool activation_checkpointing, int first_backward_block) {
  KeptSets sets;
  sets.of_layer.assign(static_cast<std::size_t>(n_layer), 0);
  if (activation_checkpointing) {
    sets.count = 1;
    return sets;
  }
  const int first = std::clamp(first_backward_block, 0, n_layer);
  const int shared = first > 0 ? 1 : 0;
  sets.count = shared + n_layer - first;
  for (int l = first; l < n_layer; ++l)
    sets.of_layer[static_cast<std::size_t>(l)] = shared + l - first;
  return sets;
}

std::int64_t layout_activations(const TransformerSpec& spec, const TransformerOptions& options,
                                int B, int T, DType dtype, BlockActivations& blocks,
                                TransformerActs* acts, DevicePtr<std::byte> base, bool whole_logits,
                                int first_backward_block) {
  using I64 = std::int64_t;
  PassShape s{B, T, static_cast<I64>(dtype_size(dtype))};
  s.mlp_tile_setting = options.mlp_tile_rows;
  const I64 N = s.N();
  const I64 C = spec.hidden_size;
  const I64 row = N * C * s.S;  // one (N,C) tensor
  const int L = spec.n_layer;
  acts->residual.assign(L + 1, TransformerActs::Bytes());
  ActivationPlanner p;
  const bool offloaded = offloaded_block_inputs(L, options) > 0;
  const int first_kept = std::clamp(first_backward_block, 0, L);
  if (offloaded) {  // two slots for the blocks' inputs, and the last block's output
    p.bytes(&acts->residual[0], row);
    p.bytes(&acts->residual[1], row);
    p.bytes(&acts->residual[L], row);
  } else {
    // Below the first block with a backward, two rows in turn (bound below).
    for (int l = 0; l <= L; ++l) {
      if (l < 2 || l >= first_kept) p.bytes(&acts->residual[static_cast<std::size_t>(l)], row);
    }
  }
  acts->kept = kept_sets(L, options.activation_checkpointing, first_kept);
  blocks.plan_forward(p, s, acts->kept);
  p.bytes(&acts->lnf, row);
  if (spec.final_norm == NormKind::kLayerNorm) p.floats(&acts->lnf_mean, N);
  p.floats(&acts->lnf_rstd, N);
  acts->head_rows = head_tile_rows(spec, options, N, s.S, whole_logits);
  p.bytes(&acts->logits, I64{acts->head_rows} * kernels::logits_row_stride(spec.vocab_size) * s.S);
  p.floats(&acts->losses, N);
  p.bytes(&acts->dres, row);
  p.bytes(&acts->dlnf, row);
  blocks.plan_backward(p, s);
  const I64 accumulated_begin = p.total();
  blocks.plan_accumulated(p, s);
  acts->accumulated_grad_bytes = p.total() - accumulated_begin;
  if (base) {
    p.bind(base);
    acts->accumulated_grads = base + accumulated_begin;
    if (offloaded) {
      for (int l = 2; l < L; ++l) acts->residual[l] = acts->residual[CheckpointOffload::slot_of(l)];
    } else {
      for (int l = 2; l < first_kept; ++l) acts->residual[l] = acts->residual[l % 2];
    }
  }
  return p.total();
}

int head_tile_rows(const TransformerSpec& spec, const TransformerOptions& options, std::int64_t N,
                   std::int64_t S, bool whole_logits) {
  if (whole_logits) return static_cast<int>(N);
  return head_tile_rows(spec.vocab_size, options, N, S);
}

int head_tile_rows(int vocab_size, const TransformerOptions& options, std::int64_t N,
                   std::int64_t S) {
  return head_tile_rows(options.head_tile_rows, N, kernels::logits_row_stride(vocab_size) * S);
}

}  // namespace zrt::transformer
