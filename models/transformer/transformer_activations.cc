#include "models/transformer/transformer_activations.h"

#include "kernels/ops.h"

namespace zrt::transformer {

std::int64_t layout_activations(const TransformerSpec& spec, const TransformerOptions& options,
                                int B, int T, DType dtype, BlockActivations& blocks,
                                TransformerActs* acts, DevicePtr<std::byte> base) {
  using I64 = std::int64_t;
  const PassShape s{B, T, static_cast<I64>(dtype_size(dtype))};
  const I64 N = s.N();
  const I64 C = spec.hidden_size;
  const I64 row = N * C * s.S;  // one (N,C) tensor
  acts->residual.assign(spec.n_layer + 1, TransformerActs::Bytes());
  ActivationPlanner p;
  for (TransformerActs::Bytes& r : acts->residual) p.bytes(&r, row);
  blocks.plan_forward(p, s, options.activation_checkpointing ? 1 : spec.n_layer);
  p.bytes(&acts->lnf, row);
  if (spec.final_norm == NormKind::kLayerNorm) p.floats(&acts->lnf_mean, N);
  p.floats(&acts->lnf_rstd, N);
  p.bytes(&acts->logits, N * kernels::logits_row_stride(spec.vocab_size) * s.S);
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
  }
  return p.total();
}

}  // namespace zrt::transformer
