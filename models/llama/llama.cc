#include "models/llama/llama.h"

#include <utility>

#include "kernels/ops.h"
#include "models/activation_planner.h"
#include "models/init_rng.h"
#include "runtime/common/error.h"

namespace zrt::llama {

namespace k = zrt::kernels;

namespace {

using I64 = std::int64_t;

constexpr double kInitStd = 0.02;  // transformers' initializer_range default

// The block's parameters in transformers' state-dict order, with their suffix names.
struct SlotName {
  Llama::Slot slot;
  const char* name;
  bool bias;
};
constexpr SlotName kSlotNames[] = {
    {Llama::kQW, "self_attn.q_proj.weight", false},
    {Llama::kQB, "self_attn.q_proj.bias", true},
    {Llama::kKW, "self_attn.k_proj.weight", false},
    {Llama::kKB, "self_attn.k_proj.bias", true},
    {Llama::kVW, "self_attn.v_proj.weight", false},
    {Llama::kVB, "self_attn.v_proj.bias", true},
    {Llama::kOW, "self_attn.o_proj.weight", false},
    {Llama::kGateW, "mlp.gate_proj.weight", false},
    {Llama::kUpW, "mlp.up_proj.weight", false},
    {Llama::kDownW, "mlp.down_proj.weight", false},
    {Llama::kLn1W, "input_layernorm.weight", false},
    {Llama::kLn2W, "post_attention_layernorm.weight", false},
};

std::vector<I64> slot_shape(const LlamaConfig& c, Llama::Slot slot) {
  const I64 C = c.hidden_size, I = c.intermediate_size;
  const I64 Q = I64{c.num_attention_heads} * c.head_dim;
  const I64 KV = I64{c.num_key_value_heads} * c.head_dim;
  switch (slot) {
    case Llama::kQW:
      return {Q, C};
    case Llama::kQB:
      return {Q};
    case Llama::kKW:
    case Llama::kVW:
      return {KV, C};
    case Llama::kKB:
    case Llama::kVB:
      return {KV};
    case Llama::kOW:
      return {C, Q};
    case Llama::kGateW:
    case Llama::kUpW:
      return {I, C};
    case Llama::kDownW:
      return {C, I};
    default:
      return {C};  // the two RMSNorm weights
  }
}

}  // namespace

kernels::RopeTable rope_table(const LlamaConfig& c) {
  kernels::RopeScalingParams s;
  s.rope_type = c.rope_scaling.rope_type;
  s.factor = c.rope_scaling.factor;
  s.low_freq_factor = c.rope_scaling.low_freq_factor;
  s.high_freq_factor = c.rope_scaling.high_freq_factor;
  s.original_max_position_embeddings = c.rope_scaling.original_max_position_embeddings;
  return kernels::make_rope_table(c.head_dim, c.rope_theta, s);
}

Llama::Llama(LlamaConfig config, kernels::KernelContext& ctx, LlamaOptions options)
    : config_(std::move(config)), options_(options), ctx_(ctx) {
  config_.validate();
  params_ = parameter_table(config_);
  int offset = 0;
  for (const SlotName& s : kSlotNames) {
    slot_offset_[s.slot] = (s.bias && !config_.attention_bias) ? -1 : offset++;
  }
  per_layer_ = offset;
  rope_ = rope_table(config_);
  loss_buffer_ = ctx_.device().allocate(kActivationAlign, MemCategory::kActivations, "llama loss",
                                        MemorySpace::kDevice, &ctx_.stream());
  loss_ = loss_buffer_.device<float>();
}

std::vector<ParamSpec> Llama::parameter_table(const LlamaConfig& c) {
  std::vector<ParamSpec> params;
  const I64 C = c.hidden_size;
  const int L = c.num_hidden_layers;
  const int head_module = L + 1;
  std::vector<int> embed_modules = {0};
  if (c.tie_word_embeddings) embed_modules.push_back(head_module);
  params.push_back({"model.embed_tokens.weight", {c.vocab_size, C}, embed_modules, false});
  for (int l = 0; l < L; ++l) {
    const std::string prefix = "model.layers." + std::to_string(l) + ".";
    for (const SlotName& s : kSlotNames) {
      if (s.bias && !c.attention_bias) continue;
      const std::vector<I64> shape = slot_shape(c, s.slot);
      params.push_back({prefix + s.name, shape, {l + 1}, shape.size() == 1});
    }
  }
  params.push_back({"model.norm.weight", {C}, {head_module}, true});
  if (!c.tie_word_embeddings) {
    params.push_back({"lm_head.weight", {c.vocab_size, C}, {head_module}, false});
  }
  return params;
}

int Llama::block_param(int layer, int slot) const {
  const int offset = slot_offset_[slot];
  return offset < 0 ? -1 : 1 + layer * per_layer_ + offset;
}

void Llama::init_parameter(int index, std::uint64_t seed, std::int64_t begin, std::int64_t count,
                           float* out) const {
  ZRT_CHECK(index >= 0 && index < static_cast<int>(params_.size()), "parameter index {} of {}",
            index, params_.size());
  const ParamSpec& spec = params_[index];
  ZRT_CHECK(begin >= 0 && count >= 0 && begin + count <= spec.numel(),
            "elements [{}, {}) of {} ({} elements)", begin, begin + count, spec.name, spec.numel());
  if (spec.shape.size() == 1) {  // biases 0, RMSNorm weights 1
    const bool norm_weight = spec.name.find("norm.weight") != std::string::npos;
    for (I64 i = 0; i < count; ++i) out[i] = norm_weight ? 1.0f : 0.0f;
    return;
  }
  fill_counter_normal(seed, static_cast<std::uint64_t>(index), begin, count, kInitStd, out);
}

// The layout (S = bytes per element of the compute dtype, N = B*T, statistics fp32, each
// tensor rounded up to 256 bytes):
//   residual stream       L + 1 of (N,C)
//   per block kept for backward (L sets; one reused set under checkpointing):
//     ln1, res2, ln2 (N,C); q, atty (N,NH*hd); k, v (N,NKV*hd); gate, up, h (N,I);
//     ln1/ln2 rstd (N); attention's row log-sum-exp (B,NH,T) fp32
//   proj (N,C) scratch; head: lnf (N,C), its rstd, logits (N,V) in rows of
//   logits_row_stride(V) (their gradient in place), losses (N)
//   backward: dres, dlnf (N,C); one block's dln1, dln2 (N,C), dq, datty (N,NH*hd), dk, dv
//   (N,NKV*hd), dgate, dup, dh (N,I)
//   plus the 256-byte loss scalar (allocated apart, counted here).
std::int64_t Llama::layout_activations(const LlamaConfig& c, bool checkpointing, int B, int T,
                                       DType dtype, Acts* acts, Bytes base) {
  const I64 S = static_cast<I64>(dtype_size(dtype));
  const I64 N = I64{B} * T;
  const I64 C = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  const I64 Q = I64{c.num_attention_heads} * c.head_dim;
  const I64 KV = I64{c.num_key_value_heads} * c.head_dim;
  const int L = c.num_hidden_layers;
  acts->residual.assign(L + 1, Bytes());
  acts->block.assign(checkpointing ? 1 : L, BlockActs());
  ActivationPlanner p;
  for (Bytes& r : acts->residual) p.bytes(&r, N * C * S);
  for (BlockActs& a : acts->block) {
    p.bytes(&a.ln1, N * C * S);
    p.floats(&a.ln1_rstd, N);
    p.bytes(&a.q, N * Q * S);
    p.bytes(&a.k, N * KV * S);
    p.bytes(&a.v, N * KV * S);
    p.floats(&a.lse, I64{B} * c.num_attention_heads * T);
    p.bytes(&a.atty, N * Q * S);
    p.bytes(&a.res2, N * C * S);
    p.bytes(&a.ln2, N * C * S);
    p.floats(&a.ln2_rstd, N);
    p.bytes(&a.gate, N * I * S);
    p.bytes(&a.up, N * I * S);
    p.bytes(&a.h, N * I * S);
  }
  p.bytes(&acts->proj, N * C * S);
  p.bytes(&acts->lnf, N * C * S);
  p.floats(&acts->lnf_rstd, N);
  p.bytes(&acts->logits, N * k::logits_row_stride(static_cast<int>(V)) * S);
  p.floats(&acts->losses, N);
  p.bytes(&acts->dres, N * C * S);
  p.bytes(&acts->dlnf, N * C * S);
  p.bytes(&acts->dln1, N * C * S);
  p.bytes(&acts->datty, N * Q * S);
  p.bytes(&acts->dln2, N * C * S);
  p.bytes(&acts->dh, N * I * S);
  const I64 accumulated_begin = p.total();
  p.bytes(&acts->dq, N * Q * S);
  p.bytes(&acts->dk, N * KV * S);
  p.bytes(&acts->dv, N * KV * S);
  p.bytes(&acts->dgate, N * I * S);
  p.bytes(&acts->dup, N * I * S);
  acts->accumulated_grad_bytes = p.total() - accumulated_begin;
  if (base) {
    p.bind(base);
    acts->accumulated_grads = acts->dq;
  }
  return p.total();
}

std::int64_t Llama::activation_bytes(const LlamaConfig& config, int B, int T, DType dtype,
                                     bool activation_checkpointing) {
  Acts scratch;
  return layout_activations(config, activation_checkpointing, B, T, dtype, &scratch, Bytes()) +
         kActivationAlign;
}

void Llama::prepare(ParamAccess& access, const TokenBatch& batch, bool need_targets) {
  k::check_dtypes(access.compute_dtype(), access.grad_dtype());
  const int B = batch.batch;
  const int T = batch.seq_len;
  if (B <= 0 || T <= 0 || T > config_.seq_len) {
    ZRT_THROW(InvalidArgument, "{}: batch {}x{} (need B >= 1 and 1 <= T <= seq_len {})",
              config_.architecture, B, T, config_.seq_len);
  }
  ZRT_CHECK(static_cast<bool>(batch.inputs), "llama: batch has no input tokens");
  if (need_targets) ZRT_CHECK(static_cast<bool>(batch.targets), "llama: batch has no targets");
  ZRT_CHECK(static_cast<bool>(batch.positions) == static_cast<bool>(batch.doc_start),
            "llama: a packed batch needs both positions and doc_start");
  positions_ = batch.positions;
  doc_start_ = batch.doc_start;
  grad_dtype_ = access.grad_dtype();
  if (B == B_ && T == T_ && access.compute_dtype() == dtype_ && !act_buffer_.empty()) return;
  act_buffer_.reset();  // stream-ordered: passes already enqueued keep their memory
  B_ = B;
  T_ = T;
  dtype_ = access.compute_dtype();
  const bool ckpt = options_.activation_checkpointing;
  const I64 total = layout_activations(config_, ckpt, B, T, dtype_, &acts_, Bytes());
  act_buffer_ =
      ctx_.device().allocate(total, MemCategory::kActivations,
                             fmt::format("{} activations (B={} T={})", config_.architecture, B, T),
                             MemorySpace::kDevice, &ctx_.stream());
  layout_activations(config_, ckpt, B, T, dtype_, &acts_, act_buffer_.device<std::byte>());
}

const Llama::BlockActs& Llama::block_acts(int layer) const {
  return acts_.block[options_.activation_checkpointing ? 0 : layer];
}

void Llama::block_forward(ParamAccess& a, int layer, const BlockActs& x, Bytes res_in,
                          Bytes res_out) {
  const int N = B_ * T_;
  const int C = config_.hidden_size, I = config_.intermediate_size, hd = config_.head_dim;
  const int NH = config_.num_attention_heads, NKV = config_.num_key_value_heads;
  const int Q = NH * hd, KV = NKV * hd;
  const DType dt = dtype_;
  auto P = [&](int slot) {
    const int index = block_param(layer, slot);
    return index < 0 ? Bytes() : a.param(index);
  };
  k::rmsnorm_forward(ctx_, dt, x.ln1, x.ln1_rstd, res_in, P(kLn1W), N, C, config_.rms_norm_eps);
  k::linear_forward(ctx_, dt, x.q, x.ln1, P(kQW), P(kQB), N, C, Q);
  k::linear_forward(ctx_, dt, x.k, x.ln1, P(kKW), P(kKB), N, C, KV);
  k::linear_forward(ctx_, dt, x.v, x.ln1, P(kVW), P(kVB), N, C, KV);
  k::rope_forward(ctx_, dt, x.q, x.q, rope_, B_, T_, NH, hd, positions_);
  k::rope_forward(ctx_, dt, x.k, x.k, rope_, B_, T_, NKV, hd, positions_);
  k::gqa_attention_forward(ctx_, dt, x.atty, x.lse, x.q, x.k, x.v, B_, T_, NH, NKV, hd, doc_start_);
  k::linear_forward(ctx_, dt, acts_.proj, x.atty, P(kOW), Bytes(), N, Q, C);
  k::residual_rmsnorm_forward(ctx_, dt, x.res2, x.ln2, x.ln2_rstd, res_in, acts_.proj, P(kLn2W), N,
                              C, config_.rms_norm_eps);
  k::linear_forward(ctx_, dt, x.gate, x.ln2, P(kGateW), Bytes(), N, C, I);
  k::linear_forward(ctx_, dt, x.up, x.ln2, P(kUpW), Bytes(), N, C, I);
  k::swiglu_forward(ctx_, dt, x.h, x.gate, x.up, I64{N} * I);
  if (res_out) {
    k::linear_forward(ctx_, dt, acts_.proj, x.h, P(kDownW), Bytes(), N, I, C);
    k::residual_forward(ctx_, dt, res_out, x.res2, acts_.proj, I64{N} * C);
  }
}

// On entry acts_.dres holds the gradient of the block's output; on exit that of its input
// (the residual adds' backward happens in place: the branch projections read dres as their
// output gradient and the RMSNorms accumulate into it).
void Llama::block_backward(ParamAccess& a, int layer, const BlockActs& x, Bytes res_in) {
  const int N = B_ * T_;
  const int C = config_.hidden_size, I = config_.intermediate_size, hd = config_.head_dim;
  const int NH = config_.num_attention_heads, NKV = config_.num_key_value_heads;
  const int Q = NH * hd, KV = NKV * hd;
  const DType dt = dtype_;
  const DType gt = grad_dtype_;
  auto P = [&](int slot) { return a.param(block_param(layer, slot)); };
  auto G = [&](int slot) {
    const int index = block_param(layer, slot);
    return index < 0 ? Bytes() : a.grad(index);
  };
  Acts& d = acts_;
  // The first projection into dh, dln2, datty and dln1 overwrites it; the next ones add.
  const k::GradWrite first = k::GradWrite::kOverwrite;
  ctx_.device().fill_zero(d.accumulated_grads, static_cast<std::size_t>(d.accumulated_grad_bytes),
                          ctx_.stream());
  k::linear_backward(ctx_, dt, gt, d.dh, G(kDownW), Bytes(), d.dres, x.h, P(kDownW), N, I, C,
                     first);
  k::swiglu_backward(ctx_, dt, d.dgate, d.dup, d.dh, x.gate, x.up, I64{N} * I);
  k::linear_backward(ctx_, dt, gt, d.dln2, G(kGateW), Bytes(), d.dgate, x.ln2, P(kGateW), N, C, I,
                     first);
  k::linear_backward(ctx_, dt, gt, d.dln2, G(kUpW), Bytes(), d.dup, x.ln2, P(kUpW), N, C, I);
  k::rmsnorm_backward(ctx_, dt, gt, d.dres, G(kLn2W), d.dln2, x.res2, P(kLn2W), x.ln2_rstd, N, C);
  k::linear_backward(ctx_, dt, gt, d.datty, G(kOW), Bytes(), d.dres, x.atty, P(kOW), N, Q, C,
                     first);
  k::gqa_attention_backward(ctx_, dt, d.dq, d.dk, d.dv, d.datty, x.q, x.k, x.v, x.atty, x.lse, B_,
                            T_, NH, NKV, hd, doc_start_);
  k::rope_backward(ctx_, dt, d.dq, d.dq, rope_, B_, T_, NH, hd, positions_);
  k::rope_backward(ctx_, dt, d.dk, d.dk, rope_, B_, T_, NKV, hd, positions_);
  k::linear_backward(ctx_, dt, gt, d.dln1, G(kQW), G(kQB), d.dq, x.ln1, P(kQW), N, C, Q, first);
  k::linear_backward(ctx_, dt, gt, d.dln1, G(kKW), G(kKB), d.dk, x.ln1, P(kKW), N, C, KV);
  k::linear_backward(ctx_, dt, gt, d.dln1, G(kVW), G(kVB), d.dv, x.ln1, P(kVW), N, C, KV);
  k::rmsnorm_backward(ctx_, dt, gt, d.dres, G(kLn1W), d.dln1, res_in, P(kLn1W), x.ln1_rstd, N, C);
}

void Llama::run_forward(ParamAccess& a, const TokenBatch& batch, Phase phase) {
  const int L = config_.num_hidden_layers;
  const int N = B_ * T_;
  const int C = config_.hidden_size;
  const int V = config_.vocab_size;
  const DType dt = dtype_;
  a.acquire(0, phase);
  k::encoder_forward(ctx_, dt, acts_.residual[0], batch.inputs, a.param(embed()), Bytes(), B_, T_,
                     C, V);
  a.release(0, phase);
  for (int l = 0; l < L; ++l) {
    a.acquire(l + 1, phase);
    block_forward(a, l, block_acts(l), acts_.residual[l], acts_.residual[l + 1]);
    a.release(l + 1, phase);
  }
  a.acquire(L + 1, phase);
  k::rmsnorm_forward(ctx_, dt, acts_.lnf, acts_.lnf_rstd, acts_.residual[L], a.param(norm()), N, C,
                     config_.rms_norm_eps);
  k::logits_forward(ctx_, dt, acts_.logits, acts_.lnf, a.param(head()), N, C, V,
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

void Llama::forward(ParamAccess& access, const TokenBatch& batch) {
  prepare(access, batch, /*need_targets=*/false);
  run_forward(access, batch, Phase::kEval);
}

void Llama::forward_backward(ParamAccess& a, const TokenBatch& batch, float loss_scale) {
  prepare(a, batch, /*need_targets=*/true);
  run_forward(a, batch, Phase::kForward);

  const int L = config_.num_hidden_layers;
  const int N = B_ * T_;
  const int C = config_.hidden_size;
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
  k::logits_backward(ctx_, dt, gt, acts_.dlnf, a.grad(head()), acts_.logits, acts_.lnf,
                     a.param(head()), N, C, V, k::logits_row_stride(V));
  k::rmsnorm_backward(ctx_, dt, gt, acts_.dres, a.grad(norm()), acts_.dlnf, acts_.residual[L],
                      a.param(norm()), acts_.lnf_rstd, N, C);
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
  k::encoder_backward(ctx_, dt, gt, a.grad(embed()), Bytes(), acts_.dres, batch.inputs, B_, T_, C,
                      V);
  a.release(0, Phase::kBackward);
}

std::int64_t Llama::logits_row_stride() const {
  return k::logits_row_stride(config_.vocab_size);
}

float Llama::read_loss() {
  float value = 0.0f;
  ctx_.device().copy_to_host(&value, loss_.as<const std::byte>(), sizeof value, ctx_.stream());
  ctx_.stream().synchronize();
  return value;
}

}  // namespace zrt::llama
