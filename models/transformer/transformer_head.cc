// The shared driver's head (module L+1): the final norm, the logits, the loss and their
// backward, in tiles of rows of the sequence (tiling.h). One tile of all N rows is the untiled
// head. A training forward stops at the final norm: each tile's logits are computed in the
// backward, where the fused classifier takes the tile's losses and its dlogits from one pass
// over them (llm.c's scheme), so a tile's logits are computed once per step and no
// log-sum-exp needs to be kept between the passes.
#include <algorithm>

#include "kernels/ops.h"
#include "models/transformer/tiling.h"
#include "models/transformer/transformer_model.h"

namespace zrt::transformer {

namespace k = zrt::kernels;

void TransformerModel::head_logits(ParamAccess& a, int r0, int n) {
  const int C = spec_.hidden_size;
  const DType dt = pass_.dtype;
  const Bytes lnf = acts_.lnf + static_cast<std::int64_t>(r0) * C * dtype_size(dt);
  k::logits_forward(ctx_, dt, acts_.logits, lnf, a.param(spec_.head), n, C, spec_.vocab_size,
                    k::logits_row_stride(spec_.vocab_size));
}

void TransformerModel::head_forward(ParamAccess& a, const TokenBatch& batch, Phase phase) {
  const int N = pass_.N();
  const int C = spec_.hidden_size;
  const int V = spec_.vocab_size;
  const DType dt = pass_.dtype;
  const Bytes last = acts_.residual[spec_.n_layer];  // the last block's output
  if (spec_.final_norm == NormKind::kLayerNorm) {
    k::layernorm_forward(ctx_, dt, acts_.lnf, acts_.lnf_mean, acts_.lnf_rstd, last,
                         a.param(spec_.final_norm_weight), a.param(spec_.final_norm_bias), N, C);
  } else {
    k::rmsnorm_forward(ctx_, dt, acts_.lnf, acts_.lnf_rstd, last, a.param(spec_.final_norm_weight),
                       N, C, spec_.norm_eps);
  }
  // A training forward leaves the logits and the loss to the backward.
  if (phase == Phase::kForward) return;
  const int rows = acts_.head_rows;
  for (int r0 = 0; r0 < N; r0 += rows) {
    const int n = std::min(rows, N - r0);
    head_logits(a, r0, n);
    if (batch.targets) {
      k::crossentropy_forward(ctx_, dt, acts_.losses + r0, acts_.logits, batch.targets + r0, n, V,
                              k::logits_row_stride(V));
    }
  }
  if (batch.targets) k::loss_mean(ctx_, loss_, acts_.losses, N, batch.loss_divisor);
}

void TransformerModel::head_backward(ParamAccess& a, const TokenBatch& batch, float loss_scale) {
  const int N = pass_.N();
  const int C = spec_.hidden_size;
  const int V = spec_.vocab_size;
  const DType dt = pass_.dtype, gt = pass_.grad_dtype;
  const Bytes last = acts_.residual[spec_.n_layer];
  const std::int64_t row_bytes = static_cast<std::int64_t>(C) * dtype_size(dt);
  ctx_.device().fill_zero(acts_.dres, static_cast<std::size_t>(N * row_bytes), ctx_.stream());
  ctx_.device().fill_zero(acts_.dlnf, static_cast<std::size_t>(N * row_bytes), ctx_.stream());
  // Per tile: its logits, then the losses and the dlogits in place of the logits (the loss is
  // the tokens' sum over the batch's divisor, TokenBatch, so each row's gradient gets
  // 1/divisor, 0 for a masked row), then the tile's rows of dlnf and the head's gradient,
  // accumulated over the tiles.
  const float divisor = batch.loss_divisor > 0.f ? batch.loss_divisor : static_cast<float>(N);
  const int rows = acts_.head_rows;
  for (int r0 = 0; r0 < N; r0 += rows) {
    const int n = std::min(rows, N - r0);
    head_logits(a, r0, n);
    k::crossentropy_forward_backward(ctx_, dt, acts_.losses + r0, acts_.logits, acts_.logits,
                                     batch.targets + r0, loss_scale / divisor, n, V,
                                     k::logits_row_stride(V));
    k::logits_backward(ctx_, dt, gt, acts_.dlnf + r0 * row_bytes, trained_grad(a, spec_.head),
                       acts_.logits, acts_.lnf + r0 * row_bytes, a.param(spec_.head), n, C, V,
                       k::logits_row_stride(V));
  }
  k::loss_mean(ctx_, loss_, acts_.losses, N, batch.loss_divisor);
  if (spec_.final_norm == NormKind::kLayerNorm) {
    k::layernorm_backward(ctx_, dt, gt, acts_.dres, trained_grad(a, spec_.final_norm_weight),
                          trained_grad(a, spec_.final_norm_bias), acts_.dlnf, last,
                          a.param(spec_.final_norm_weight), acts_.lnf_mean, acts_.lnf_rstd, N, C);
  } else {
    k::rmsnorm_backward(ctx_, dt, gt, acts_.dres, trained_grad(a, spec_.final_norm_weight),
                        acts_.dlnf, last, a.param(spec_.final_norm_weight), acts_.lnf_rstd, N, C);
  }
}

}  // namespace zrt::transformer
