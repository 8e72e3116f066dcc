#include "models/transformer/transformer_activations.h"

#include "kernels/ops.h"
#include "models/transformer/checkpoint_offload.h"
#include "models/transformer/tiling.h"

namespace zrt::transformer {

std::int64_t layout_activations(const TransformerSpec& spec, const TransformerOptions& options,
                                int B, int T, DType dtype, BlockActivations& blocks,
                                TransformerActs* acts, DevicePtr<std::byte> base,
                                bool whole_logits) {
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
  if (offloaded) {  // two slots for the blocks' inputs, and the last block's output
    p.bytes(&acts->residual[0], row);
    p.bytes(&acts->residual[1], row);
    p.bytes(&acts->residual[L], row);
  } else {
    for (TransformerActs::Bytes& r : acts->residual) p.bytes(&r, row);
  }
  blocks.plan_forward(p, s, options.activation_checkpointing ? 1 : L);
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
  return tile_rows(options.head_tile_rows, N, kernels::logits_row_stride(vocab_size) * S,
                   kHeadTileBudgetBytes);
}

}  // namespace zrt::transformer
