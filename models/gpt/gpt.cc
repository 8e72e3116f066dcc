#include "models/gpt/gpt.h"

#include <cmath>
#include <utility>

#include "kernels/ops.h"
#include "models/activation_planner.h"
#include "models/init_rng.h"
#include "runtime/common/error.h"

namespace zrt::gpt {

namespace k = zrt::kernels;

namespace {

using I64 = std::int64_t;

constexpr I64 kAlign = kActivationAlign;
constexpr double kInitStd = 0.02;

// Block parameter slots, Hugging Face order.
enum Slot {
  kLn1W,
  kLn1B,
  kQkvW,
  kQkvB,
  kAttProjW,
  kAttProjB,
  kLn2W,
  kLn2B,
  kFcW,
  kFcB,
  kFcProjW,
  kFcProjB,
};

}  // namespace

Gpt::Gpt(GptConfig config, kernels::KernelContext& ctx, GptOptions options)
    : config_(std::move(config)), options_(options), ctx_(ctx) {
  config_.validate();
  params_ = parameter_table(config_);
  loss_buffer_ = ctx_.device().allocate(kAlign, MemCategory::kActivations, "gpt loss",
                                        MemorySpace::kDevice, &ctx_.stream());
  loss_ = loss_buffer_.device<float>();
}

std::vector<ParamSpec> Gpt::parameter_table(const GptConfig& config) {
  std::vector<ParamSpec> params;
  const I64 C = config.n_embd;
  const int L = config.n_layer;
  const int final_module = L + 1;
  params.push_back({"transformer.wte.weight", {config.vocab_size, C}, {0, final_module}, false});
  params.push_back({"transformer.wpe.weight", {config.seq_len, C}, {0}, false});
  for (int l = 0; l < L; ++l) {
    const std::string p = "transformer.h." + std::to_string(l) + ".";
    const std::vector<int> m = {l + 1};
    params.push_back({p + "ln_1.weight", {C}, m, true});
    params.push_back({p + "ln_1.bias", {C}, m, true});
    params.push_back({p + "attn.c_attn.weight", {C, 3 * C}, m, false});
    params.push_back({p + "attn.c_attn.bias", {3 * C}, m, true});
    params.push_back({p + "attn.c_proj.weight", {C, C}, m, false});
    params.push_back({p + "attn.c_proj.bias", {C}, m, true});
    params.push_back({p + "ln_2.weight", {C}, m, true});
    params.push_back({p + "ln_2.bias", {C}, m, true});
    params.push_back({p + "mlp.c_fc.weight", {C, 4 * C}, m, false});
    params.push_back({p + "mlp.c_fc.bias", {4 * C}, m, true});
    params.push_back({p + "mlp.c_proj.weight", {4 * C, C}, m, false});
    params.push_back({p + "mlp.c_proj.bias", {C}, m, true});
  }
  params.push_back({"transformer.ln_f.weight", {C}, {final_module}, true});
  params.push_back({"transformer.ln_f.bias", {C}, {final_module}, true});
  return params;
}

void Gpt::init_parameter(int index, std::uint64_t seed, std::int64_t begin, std::int64_t count,
                         float* out) const {
  ZRT_CHECK(index >= 0 && index < static_cast<int>(params_.size()), "parameter index {} of {}",
            index, params_.size());
  const ParamSpec& spec = params_[index];
  ZRT_CHECK(begin >= 0 && count >= 0 && begin + count <= spec.numel(),
            "elements [{}, {}) of {} ({} elements)", begin, begin + count, spec.name, spec.numel());
  const std::string suffix = ".weight";
  const bool is_layernorm_weight =
      spec.name.find(".ln_") != std::string::npos &&
      spec.name.compare(spec.name.size() - suffix.size(), suffix.size(), suffix) == 0;
  if (spec.shape.size() == 1) {  // biases 0, LayerNorm weights 1
    const float value = is_layernorm_weight ? 1.0f : 0.0f;
    for (I64 i = 0; i < count; ++i) out[i] = value;
    return;
  }
  const bool residual_projection = spec.name.find("c_proj.weight") != std::string::npos;
  const double std = residual_projection ? kInitStd / std::sqrt(2.0 * config_.n_layer) : kInitStd;
  fill_counter_normal(seed, static_cast<std::uint64_t>(index), begin, count, std, out);
}

I64 Gpt::layout_activations(int B, int T, DType dtype, Acts* acts, Bytes base) const {
  const I64 S = static_cast<I64>(dtype_size(dtype));
  const I64 BT = I64{B} * T;
  const I64 C = config_.n_embd;
  const I64 V = config_.vocab_size;
  const int L = config_.n_layer;
  const I64 NH = config_.n_head;
  acts->residual.assign(L + 1, Bytes());
  acts->block.assign(options_.activation_checkpointing ? 1 : L, BlockActs());
  ActivationPlanner p;
  for (Bytes& r : acts->residual) p.bytes(&r, BT * C * S);
  for (BlockActs& a : acts->block) {
    p.bytes(&a.ln1, BT * C * S);
    p.floats(&a.ln1_mean, BT);
    p.floats(&a.ln1_rstd, BT);
    p.bytes(&a.qkv, BT * 3 * C * S);
    p.floats(&a.att_lse, I64{B} * NH * T);
    p.bytes(&a.atty, BT * C * S);
    p.bytes(&a.attproj, BT * C * S);
    p.bytes(&a.res2, BT * C * S);
    p.bytes(&a.ln2, BT * C * S);
    p.floats(&a.ln2_mean, BT);
    p.floats(&a.ln2_rstd, BT);
    p.bytes(&a.fch, BT * 4 * C * S);
    p.bytes(&a.fch_gelu, BT * 4 * C * S);
    p.bytes(&a.fcproj, BT * C * S);
  }
  p.bytes(&acts->lnf, BT * C * S);
  p.floats(&acts->lnf_mean, BT);
  p.floats(&acts->lnf_rstd, BT);
  p.bytes(&acts->logits, BT * k::logits_row_stride(static_cast<int>(V)) * S);
  p.floats(&acts->losses, BT);
  p.bytes(&acts->dres, BT * C * S);
  p.bytes(&acts->dlnf, BT * C * S);
  // The block gradient scratch; the accumulated part contiguous, so one fill_zero clears it.
  p.bytes(&acts->dln1, BT * C * S);
  p.bytes(&acts->datty, BT * C * S);
  p.bytes(&acts->dln2, BT * C * S);
  p.bytes(&acts->dfch_gelu, BT * 4 * C * S);
  p.bytes(&acts->dfch, BT * 4 * C * S);
  const I64 accumulated_begin = p.total();
  p.bytes(&acts->dqkv, BT * 3 * C * S);
  acts->accumulated_grad_bytes = p.total() - accumulated_begin;
  if (base) {
    p.bind(base);
    acts->accumulated_grads = acts->dqkv;
  }
  return p.total();
}

std::int64_t Gpt::activation_bytes(int B, int T, DType dtype) const {
  Acts scratch;
  return layout_activations(B, T, dtype, &scratch, Bytes());
}

void Gpt::prepare(ParamAccess& access, const TokenBatch& batch, bool need_targets) {
  k::check_dtypes(access.compute_dtype(), access.grad_dtype());
  const int B = batch.batch;
  const int T = batch.seq_len;
  if (B <= 0 || T <= 0 || T > config_.seq_len) {
    ZRT_THROW(InvalidArgument, "gpt: batch {}x{} (need B >= 1 and 1 <= T <= seq_len {})", B, T,
              config_.seq_len);
  }
  ZRT_CHECK(static_cast<bool>(batch.inputs), "gpt: batch has no input tokens");
  if (need_targets) ZRT_CHECK(static_cast<bool>(batch.targets), "gpt: batch has no targets");
  ZRT_CHECK(static_cast<bool>(batch.positions) == static_cast<bool>(batch.doc_start),
            "gpt: a packed batch needs both positions and doc_start");
  positions_ = batch.positions;
  doc_start_ = batch.doc_start;
  grad_dtype_ = access.grad_dtype();
  if (B == B_ && T == T_ && access.compute_dtype() == dtype_ && !act_buffer_.empty()) return;
  act_buffer_.reset();  // stream-ordered: passes already enqueued keep their memory
  B_ = B;
  T_ = T;
  dtype_ = access.compute_dtype();
  const I64 total = layout_activations(B, T, dtype_, &acts_, Bytes());
  act_buffer_ = ctx_.device().allocate(total, MemCategory::kActivations,
                                       fmt::format("gpt activations (B={} T={})", B, T),
                                       MemorySpace::kDevice, &ctx_.stream());
  layout_activations(B, T, dtype_, &acts_, act_buffer_.device<std::byte>());
}

const Gpt::BlockActs& Gpt::block_acts(int layer) const {
  return acts_.block[options_.activation_checkpointing ? 0 : layer];
}

void Gpt::block_forward(ParamAccess& a, int layer, const BlockActs& x, Bytes res_in,
                        Bytes res_out) {
  const int N = B_ * T_;
  const int C = config_.n_embd;
  const DType dt = dtype_;
  auto P = [&](int slot) { return a.param(block_param(layer, slot)); };
  k::layernorm_forward(ctx_, dt, x.ln1, x.ln1_mean, x.ln1_rstd, res_in, P(kLn1W), P(kLn1B), N, C);
  k::matmul_forward(ctx_, dt, x.qkv, x.ln1, P(kQkvW), P(kQkvB), N, C, 3 * C);
  k::attention_forward(ctx_, dt, x.atty, x.att_lse, x.qkv, B_, T_, C, config_.n_head, doc_start_);
  k::matmul_forward(ctx_, dt, x.attproj, x.atty, P(kAttProjW), P(kAttProjB), N, C, C);
  k::residual_layernorm_forward(ctx_, dt, x.res2, x.ln2, x.ln2_mean, x.ln2_rstd, res_in, x.attproj,
                                P(kLn2W), P(kLn2B), N, C);
  k::matmul_gelu_forward(ctx_, dt, x.fch_gelu, x.fch, x.ln2, P(kFcW), P(kFcB), N, C, 4 * C);
  k::matmul_forward(ctx_, dt, x.fcproj, x.fch_gelu, P(kFcProjW), P(kFcProjB), N, 4 * C, C);
  if (res_out) k::residual_forward(ctx_, dt, res_out, x.res2, x.fcproj, I64{N} * C);
}

// On entry acts_.dres holds the gradient of the block's output; on exit that of its input.
// The residual adds' backward (d_in += d_out, d_branch = d_out) happens in place: the branch
// projections read dres as their output gradient and the LayerNorms accumulate into it.
void Gpt::block_backward(ParamAccess& a, int layer, const BlockActs& x, Bytes res_in) {
  const int N = B_ * T_;
  const int C = config_.n_embd;
  const DType dt = dtype_;
  const DType gt = grad_dtype_;
  auto P = [&](int slot) { return a.param(block_param(layer, slot)); };
  auto G = [&](int slot) { return a.grad(block_param(layer, slot)); };
  Acts& d = acts_;
  const k::GradWrite once = k::GradWrite::kOverwrite;
  ctx_.device().fill_zero(d.accumulated_grads, static_cast<std::size_t>(d.accumulated_grad_bytes),
                          ctx_.stream());
  // dfch = gelu'(fch) * (dres @ W_fcproj^T), overwritten; dfch_gelu is the unfused path's scratch.
  k::matmul_dgelu_backward(ctx_, dt, gt, d.dfch, d.dfch_gelu, G(kFcProjW), G(kFcProjB), d.dres,
                           x.fch_gelu, P(kFcProjW), x.fch, N, 4 * C, C);
  k::matmul_backward(ctx_, dt, gt, d.dln2, G(kFcW), G(kFcB), d.dfch, x.ln2, P(kFcW), N, C, 4 * C,
                     once);
  k::layernorm_backward(ctx_, dt, gt, d.dres, G(kLn2W), G(kLn2B), d.dln2, x.res2, P(kLn2W),
                        x.ln2_mean, x.ln2_rstd, N, C);
  k::matmul_backward(ctx_, dt, gt, d.datty, G(kAttProjW), G(kAttProjB), d.dres, x.atty,
                     P(kAttProjW), N, C, C, once);
  k::attention_backward(ctx_, dt, d.dqkv, d.datty, x.qkv, x.atty, x.att_lse, B_, T_, C,
                        config_.n_head, doc_start_);
  k::matmul_backward(ctx_, dt, gt, d.dln1, G(kQkvW), G(kQkvB), d.dqkv, x.ln1, P(kQkvW), N, C, 3 * C,
                     once);
  k::layernorm_backward(ctx_, dt, gt, d.dres, G(kLn1W), G(kLn1B), d.dln1, res_in, P(kLn1W),
                        x.ln1_mean, x.ln1_rstd, N, C);
}

void Gpt::run_forward(ParamAccess& a, const TokenBatch& batch, Phase phase) {
  const int L = config_.n_layer;
  const int N = B_ * T_;
  const int C = config_.n_embd;
  const int V = config_.vocab_size;
  const DType dt = dtype_;
  a.acquire(0, phase);
  k::encoder_forward(ctx_, dt, acts_.residual[0], batch.inputs, a.param(wte()), a.param(wpe()), B_,
                     T_, C, V, positions_);
  a.release(0, phase);
  for (int l = 0; l < L; ++l) {
    a.acquire(l + 1, phase);
    block_forward(a, l, block_acts(l), acts_.residual[l], acts_.residual[l + 1]);
    a.release(l + 1, phase);
  }
  a.acquire(L + 1, phase);
  k::layernorm_forward(ctx_, dt, acts_.lnf, acts_.lnf_mean, acts_.lnf_rstd, acts_.residual[L],
                       a.param(lnf_weight()), a.param(lnf_bias()), N, C);
  k::logits_forward(ctx_, dt, acts_.logits, acts_.lnf, a.param(wte()), N, C, V,
                    k::logits_row_stride(V));
  // A training forward leaves its loss to the backward's fused classifier, which takes it
  // from the same pass over the logits as their gradient.
  if (batch.targets && phase != Phase::kForward) {
    k::crossentropy_forward(ctx_, dt, acts_.losses, acts_.logits, batch.targets, N, V,
                            k::logits_row_stride(V));
    k::loss_mean(ctx_, loss_, acts_.losses, N, batch.loss_divisor);
  }
  a.release(L + 1, phase);
}

void Gpt::forward(ParamAccess& access, const TokenBatch& batch) {
  prepare(access, batch, /*need_targets=*/false);
  run_forward(access, batch, Phase::kEval);
}

void Gpt::forward_backward(ParamAccess& a, const TokenBatch& batch, float loss_scale) {
  prepare(a, batch, /*need_targets=*/true);
  run_forward(a, batch, Phase::kForward);

  const int L = config_.n_layer;
  const int N = B_ * T_;
  const int C = config_.n_embd;
  const int V = config_.vocab_size;
  const DType dt = dtype_;
  const DType gt = grad_dtype_;
  const std::size_t row_bytes = static_cast<std::size_t>(N) * C * dtype_size(dt);

  a.acquire(L + 1, Phase::kBackward);
  // The losses, and the dlogits in place of the logits; the loss is the tokens' sum over the
  // batch's divisor (TokenBatch), so each row's gradient gets 1/divisor (0 for a masked row).
  const float divisor = batch.loss_divisor > 0.f ? batch.loss_divisor : static_cast<float>(N);
  k::crossentropy_forward_backward(ctx_, dt, acts_.losses, acts_.logits, acts_.logits,
                                   batch.targets, loss_scale / divisor, N, V,
                                   k::logits_row_stride(V));
  k::loss_mean(ctx_, loss_, acts_.losses, N, batch.loss_divisor);
  ctx_.device().fill_zero(acts_.dres, row_bytes, ctx_.stream());
  ctx_.device().fill_zero(acts_.dlnf, row_bytes, ctx_.stream());
  k::logits_backward(ctx_, dt, gt, acts_.dlnf, a.grad(wte()), acts_.logits, acts_.lnf,
                     a.param(wte()), N, C, V, k::logits_row_stride(V));
  k::layernorm_backward(ctx_, dt, gt, acts_.dres, a.grad(lnf_weight()), a.grad(lnf_bias()),
                        acts_.dlnf, acts_.residual[L], a.param(lnf_weight()), acts_.lnf_mean,
                        acts_.lnf_rstd, N, C);
  a.release(L + 1, Phase::kBackward);

  for (int l = L - 1; l >= 0; --l) {
    const BlockActs& x = block_acts(l);
    if (options_.activation_checkpointing) {
      a.acquire(l + 1, Phase::kRecompute);
      block_forward(a, l, x, acts_.residual[l], Bytes());
      a.release(l + 1, Phase::kRecompute);
    }
    a.acquire(l + 1, Phase::kBackward);
    block_backward(a, l, x, acts_.residual[l]);
    a.release(l + 1, Phase::kBackward);
  }

  a.acquire(0, Phase::kBackward);
  k::encoder_backward(ctx_, dt, gt, a.grad(wte()), a.grad(wpe()), acts_.dres, batch.inputs, B_, T_,
                      C, V, positions_);
  a.release(0, Phase::kBackward);
}

std::int64_t Gpt::logits_row_stride() const {
  return k::logits_row_stride(config_.vocab_size);
}

float Gpt::read_loss() {
  float value = 0.0f;
  ctx_.device().copy_to_host(&value, loss_.as<const std::byte>(), sizeof value, ctx_.stream());
  ctx_.stream().synchronize();
  return value;
}

}  // namespace zrt::gpt
