#include "models/transformer/transformer_model.h"

#include <utility>

#include "kernels/ops.h"
#include "runtime/common/error.h"

namespace zrt::transformer {

namespace k = zrt::kernels;

TransformerModel::TransformerModel(kernels::KernelContext& ctx, TransformerSpec spec,
                                   TransformerOptions options)
    : spec_(std::move(spec)), options_(options), ctx_(ctx) {
  loss_buffer_ =
      ctx_.device().allocate(kActivationAlign, MemCategory::kActivations, spec_.family + " loss",
                             MemorySpace::kDevice, &ctx_.stream());
  loss_ = loss_buffer_.device<float>();
  if (options_.sequence_parallel_size() > 1) {
    ulysses_ = std::make_unique<UlyssesExchange>(ctx_, *options_.sequence_group);
  }
}

std::int64_t TransformerModel::activation_bytes(const TransformerSpec& spec,
                                                const TransformerOptions& options, int B, int T,
                                                DType dtype, BlockActivations& scratch) {
  TransformerActs acts;
  return layout_activations(spec, options, B, T, dtype, scratch, &acts, Bytes());
}

const ParamSpec& TransformerModel::init_range(int index, std::int64_t begin,
                                              std::int64_t count) const {
  const std::vector<ParamSpec>& params = parameters();
  ZRT_CHECK(index >= 0 && index < static_cast<int>(params.size()), "parameter index {} of {}",
            index, params.size());
  const ParamSpec& spec = params[static_cast<std::size_t>(index)];
  ZRT_CHECK(begin >= 0 && count >= 0 && begin + count <= spec.numel(),
            "elements [{}, {}) of {} ({} elements)", begin, begin + count, spec.name, spec.numel());
  return spec;
}

void TransformerModel::prepare(ParamAccess& access, const TokenBatch& batch, bool need_targets) {
  k::check_dtypes(access.compute_dtype(), access.grad_dtype());
  const int B = batch.batch;
  const int T = batch.seq_len;
  const int sp = options_.sequence_parallel_size();
  if (B <= 0 || T <= 0 || std::int64_t{T} * sp > spec_.seq_len) {
    ZRT_THROW(InvalidArgument, "{}: batch {}x{}{} (need B >= 1 and 1 <= T <= seq_len {}{})",
              spec_.architecture, B, T,
              sp > 1 ? fmt::format(" in chunks of {} ranks", sp) : std::string(), spec_.seq_len,
              sp > 1 ? " for the whole sequence" : "");
  }
  ZRT_CHECK(static_cast<bool>(batch.inputs), "{}: batch has no input tokens", spec_.family);
  if (need_targets) {
    ZRT_CHECK(static_cast<bool>(batch.targets), "{}: batch has no targets", spec_.family);
  }
  if (sp > 1) {
    // A chunk's rotary angles start at its offset in the sequence: the batch says which.
    ZRT_CHECK(static_cast<bool>(batch.positions),
              "{}: a sequence-parallel chunk needs its positions", spec_.family);
  } else {
    ZRT_CHECK(static_cast<bool>(batch.positions) == static_cast<bool>(batch.doc_start),
              "{}: a packed batch needs both positions and doc_start", spec_.family);
  }
  pass_.sp = sp;
  pass_.positions = batch.positions;
  pass_.doc_start = batch.doc_start;
  pass_.grad_dtype = access.grad_dtype();
  if (B == pass_.B && T == pass_.T && access.compute_dtype() == pass_.dtype &&
      !act_buffer_.empty()) {
    return;
  }
  act_buffer_.reset();  // stream-ordered: passes already enqueued keep their memory
  pass_.B = B;
  pass_.T = T;
  pass_.dtype = access.compute_dtype();
  BlockActivations& blocks = block_activations();
  const std::int64_t total =
      layout_activations(spec_, options_, B, T, pass_.dtype, blocks, &acts_, Bytes());
  act_buffer_ =
      ctx_.device().allocate(total, MemCategory::kActivations,
                             fmt::format("{} activations (B={} T={})", spec_.architecture, B, T),
                             MemorySpace::kDevice, &ctx_.stream());
  layout_activations(spec_, options_, B, T, pass_.dtype, blocks, &acts_,
                     act_buffer_.device<std::byte>());
}

// The position table has seq_len rows: a sequence-parallel chunk's positions (global, or its
// documents') reach past the chunk's T.
void TransformerModel::embedding_forward(ParamAccess& a, const TokenBatch& batch) {
  const bool positional = spec_.position_embedding >= 0;
  k::encoder_forward(ctx_, pass_.dtype, acts_.residual[0], batch.inputs,
                     a.param(spec_.token_embedding),
                     positional ? a.param(spec_.position_embedding) : Bytes(), pass_.B, pass_.T,
                     spec_.hidden_size, spec_.vocab_size,
                     positional ? pass_.positions : DevicePtr<const std::int32_t>(), spec_.seq_len);
}

void TransformerModel::embedding_backward(ParamAccess& a, const TokenBatch& batch) {
  const bool positional = spec_.position_embedding >= 0;
  k::encoder_backward(ctx_, pass_.dtype, pass_.grad_dtype, a.grad(spec_.token_embedding),
                      positional ? a.grad(spec_.position_embedding) : Bytes(), acts_.dres,
                      batch.inputs, pass_.B, pass_.T, spec_.hidden_size, spec_.vocab_size,
                      positional ? pass_.positions : DevicePtr<const std::int32_t>(),
                      spec_.seq_len);
}

void TransformerModel::run_forward(ParamAccess& a, const TokenBatch& batch, Phase phase) {
  const int L = spec_.n_layer;
  a.acquire(kEmbeddingModule, phase);
  embedding_forward(a, batch);
  a.release(kEmbeddingModule, phase);
  for (int l = 0; l < L; ++l) {
    a.acquire(block_module(l), phase);
    block_forward(a, l, acts_.residual[l], acts_.residual[l + 1]);
    a.release(block_module(l), phase);
  }
  a.acquire(head_module(L), phase);
  head_forward(a, batch, phase);
  a.release(head_module(L), phase);
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
  k::logits_forward(ctx_, dt, acts_.logits, acts_.lnf, a.param(spec_.head), N, C, V,
                    k::logits_row_stride(V));
  // A training forward leaves its loss to the backward's fused classifier, which takes it
  // from the same pass over the logits as their gradient.
  if (batch.targets && phase != Phase::kForward) {
    k::crossentropy_forward(ctx_, dt, acts_.losses, acts_.logits, batch.targets, N, V,
                            k::logits_row_stride(V));
    k::loss_mean(ctx_, loss_, acts_.losses, N, batch.loss_divisor);
  }
}

void TransformerModel::head_backward(ParamAccess& a, const TokenBatch& batch, float loss_scale) {
  const int N = pass_.N();
  const int C = spec_.hidden_size;
  const int V = spec_.vocab_size;
  const DType dt = pass_.dtype, gt = pass_.grad_dtype;
  const Bytes last = acts_.residual[spec_.n_layer];
  const std::size_t row_bytes = static_cast<std::size_t>(N) * C * dtype_size(dt);
  // The losses, and the dlogits in place of the logits; the loss is the tokens' sum over the
  // batch's divisor (TokenBatch), so each row's gradient gets 1/divisor (0 for a masked row).
  const float divisor = batch.loss_divisor > 0.f ? batch.loss_divisor : static_cast<float>(N);
  k::crossentropy_forward_backward(ctx_, dt, acts_.losses, acts_.logits, acts_.logits,
                                   batch.targets, loss_scale / divisor, N, V,
                                   k::logits_row_stride(V));
  k::loss_mean(ctx_, loss_, acts_.losses, N, batch.loss_divisor);
  ctx_.device().fill_zero(acts_.dres, row_bytes, ctx_.stream());
  ctx_.device().fill_zero(acts_.dlnf, row_bytes, ctx_.stream());
  k::logits_backward(ctx_, dt, gt, acts_.dlnf, a.grad(spec_.head), acts_.logits, acts_.lnf,
                     a.param(spec_.head), N, C, V, k::logits_row_stride(V));
  if (spec_.final_norm == NormKind::kLayerNorm) {
    k::layernorm_backward(ctx_, dt, gt, acts_.dres, a.grad(spec_.final_norm_weight),
                          a.grad(spec_.final_norm_bias), acts_.dlnf, last,
                          a.param(spec_.final_norm_weight), acts_.lnf_mean, acts_.lnf_rstd, N, C);
  } else {
    k::rmsnorm_backward(ctx_, dt, gt, acts_.dres, a.grad(spec_.final_norm_weight), acts_.dlnf, last,
                        a.param(spec_.final_norm_weight), acts_.lnf_rstd, N, C);
  }
}

void TransformerModel::forward(ParamAccess& access, const TokenBatch& batch) {
  prepare(access, batch, /*need_targets=*/false);
  run_forward(access, batch, Phase::kEval);
}

void TransformerModel::forward_backward(ParamAccess& a, const TokenBatch& batch, float loss_scale) {
  prepare(a, batch, /*need_targets=*/true);
  run_forward(a, batch, Phase::kForward);

  const int L = spec_.n_layer;
  a.acquire(head_module(L), Phase::kBackward);
  head_backward(a, batch, loss_scale);
  a.release(head_module(L), Phase::kBackward);

  for (int l = L - 1; l >= 0; --l) {
    const int m = block_module(l);
    if (options_.activation_checkpointing) {
      a.acquire(m, Phase::kRecompute);
      block_forward(a, l, acts_.residual[l], Bytes());
      a.release(m, Phase::kRecompute);
    }
    a.acquire(m, Phase::kBackward);
    ctx_.device().fill_zero(acts_.accumulated_grads,
                            static_cast<std::size_t>(acts_.accumulated_grad_bytes), ctx_.stream());
    block_backward(a, l, acts_.residual[l]);
    a.release(m, Phase::kBackward);
  }

  a.acquire(kEmbeddingModule, Phase::kBackward);
  embedding_backward(a, batch);
  a.release(kEmbeddingModule, Phase::kBackward);
}

std::int64_t TransformerModel::logits_row_stride() const {
  return k::logits_row_stride(spec_.vocab_size);
}

float TransformerModel::read_loss() {
  float value = 0.0f;
  ctx_.device().copy_to_host(&value, loss_.as<const std::byte>(), sizeof value, ctx_.stream());
  ctx_.stream().synchronize();
  return value;
}

}  // namespace zrt::transformer
