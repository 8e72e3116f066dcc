#include "models/llama/llama.h"

#include <algorithm>
#include <utility>

#include "kernels/ops.h"
#include "models/activation_planner.h"
#include "models/init_rng.h"
#include "models/transformer/tiling.h"
#include "runtime/common/error.h"

namespace zrt::llama {

namespace k = zrt::kernels;

namespace {

using I64 = std::int64_t;

constexpr double kInitStd = 0.02;  // transformers' initializer_range default

// The block's parameters in transformers' state-dict order, with their suffix names and when
// a model has them.
enum class SlotKind { kAlways, kBias, kQkNorm };
struct SlotName {
  Llama::Slot slot;
  const char* name;
  SlotKind kind;
};
constexpr SlotName kSlotNames[] = {
    {Llama::kQW, "self_attn.q_proj.weight", SlotKind::kAlways},
    {Llama::kQB, "self_attn.q_proj.bias", SlotKind::kBias},
    {Llama::kKW, "self_attn.k_proj.weight", SlotKind::kAlways},
    {Llama::kKB, "self_attn.k_proj.bias", SlotKind::kBias},
    {Llama::kVW, "self_attn.v_proj.weight", SlotKind::kAlways},
    {Llama::kVB, "self_attn.v_proj.bias", SlotKind::kBias},
    {Llama::kOW, "self_attn.o_proj.weight", SlotKind::kAlways},
    {Llama::kQNormW, "self_attn.q_norm.weight", SlotKind::kQkNorm},
    {Llama::kKNormW, "self_attn.k_norm.weight", SlotKind::kQkNorm},
    {Llama::kGateW, "mlp.gate_proj.weight", SlotKind::kAlways},
    {Llama::kUpW, "mlp.up_proj.weight", SlotKind::kAlways},
    {Llama::kDownW, "mlp.down_proj.weight", SlotKind::kAlways},
    {Llama::kLn1W, "input_layernorm.weight", SlotKind::kAlways},
    {Llama::kLn2W, "post_attention_layernorm.weight", SlotKind::kAlways},
};

bool has_slot(const LlamaConfig& c, const SlotName& s) {
  switch (s.kind) {
    case SlotKind::kBias:
      return c.attention_bias;
    case SlotKind::kQkNorm:
      return c.qk_norm();
    default:
      return true;
  }
}

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
    case Llama::kQNormW:
    case Llama::kKNormW:
      return {c.head_dim};  // one weight shared by every head
    default:
      return {C};  // the two RMSNorm weights
  }
}

int params_per_block(const LlamaConfig& c) {
  int count = 0;
  for (const SlotName& s : kSlotNames) count += has_slot(c, s) ? 1 : 0;
  return count;
}

// The driver's view of a Llama of `config`, once `config` is valid.
transformer::TransformerSpec transformer_spec(const LlamaConfig& c) {
  c.validate();
  transformer::TransformerSpec spec;
  spec.family = "llama";
  spec.architecture = c.architecture;
  spec.final_norm = transformer::NormKind::kRmsNorm;
  spec.norm_eps = c.rms_norm_eps;
  spec.n_layer = c.num_hidden_layers;
  spec.hidden_size = c.hidden_size;
  spec.vocab_size = c.vocab_size;
  spec.seq_len = c.seq_len;
  spec.token_embedding = 0;
  spec.position_embedding = -1;  // RoPE, in the blocks
  spec.final_norm_weight = 1 + c.num_hidden_layers * params_per_block(c);
  spec.head = c.tie_word_embeddings ? spec.token_embedding : spec.final_norm_weight + 1;
  return spec;
}

}  // namespace

kernels::RopeTable rope_table(const LlamaConfig& c) {
  return kernels::make_rope_table(c.head_dim, c.rope_theta, c.rope_scaling.params());
}

transformer::SequenceParallelShape Llama::sequence_parallel_shape(const LlamaConfig& c) {
  transformer::SequenceParallelShape shape;
  shape.query_heads = c.num_attention_heads;
  shape.query_heads_name = "query heads (num_attention_heads)";
  shape.key_value_heads = c.num_key_value_heads;
  shape.seq_len = c.seq_len;
  return shape;
}

std::vector<std::string> Llama::sequence_parallel_problems(const LlamaConfig& c, int sp) {
  return transformer::sequence_parallel_problems(sequence_parallel_shape(c), sp);
}

namespace {

// The model's config, after refusing a sequence-parallel group it cannot use.
const LlamaConfig& checked_llama_config(const LlamaConfig& c, const LlamaOptions& options) {
  transformer::require_sequence_parallel_fits(c.architecture, Llama::sequence_parallel_shape(c),
                                              options.sequence_parallel_size());
  return c;
}

}  // namespace

Llama::Llama(LlamaConfig config, kernels::KernelContext& ctx, LlamaOptions options)
    : TransformerModel(ctx, transformer_spec(checked_llama_config(config, options)), options),
      config_(std::move(config)),
      params_(parameter_table(config_)),
      rope_(rope_table(config_)),
      acts_(config_, options.sequence_parallel_size()) {
  int offset = 0;
  for (const SlotName& s : kSlotNames) {
    slot_offset_[s.slot] = has_slot(config_, s) ? offset++ : -1;
  }
  per_layer_ = offset;
}

std::vector<ParamSpec> Llama::parameter_table(const LlamaConfig& c) {
  std::vector<ParamSpec> params;
  const I64 C = c.hidden_size;
  const int L = c.num_hidden_layers;
  const int head_module = transformer::head_module(L);
  std::vector<int> embed_modules = {transformer::kEmbeddingModule};
  if (c.tie_word_embeddings) embed_modules.push_back(head_module);
  params.push_back({"model.embed_tokens.weight", {c.vocab_size, C}, embed_modules, false});
  for (int l = 0; l < L; ++l) {
    const std::string prefix = "model.layers." + std::to_string(l) + ".";
    for (const SlotName& s : kSlotNames) {
      if (!has_slot(c, s)) continue;
      const std::vector<I64> shape = slot_shape(c, s.slot);
      params.push_back({prefix + s.name, shape, {transformer::block_module(l)}, shape.size() == 1});
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
  const ParamSpec& spec = init_range(index, begin, count);
  if (spec.shape.size() == 1) {  // biases 0, RMSNorm weights 1 (Qwen3's q_norm / k_norm too)
    const bool norm_weight = spec.name.find("norm.weight") != std::string::npos;
    for (I64 i = 0; i < count; ++i) out[i] = norm_weight ? 1.0f : 0.0f;
    return;
  }
  fill_counter_normal(seed, static_cast<std::uint64_t>(index), begin, count, kInitStd, out);
}

// The blocks' part of the layout (transformer_activations.h has the rest; S = bytes per element
// of the compute dtype, N = B*T, statistics fp32):
//   kept for backward (L sets; one reused set under checkpointing): ln1, res2, ln2 (N,C); q,
//     atty (N,NH*hd); k, v (N,NKV*hd); gate, up, h (N,I); ln1/ln2 rstd (N); attention's row
//     log-sum-exp (B,NH,T) fp32; Qwen3 (qk_norm) adds q_pre (N,NH*hd), k_pre (N,NKV*hd) and
//     their per-head rstd (N*NH, N*NKV) fp32; then proj (N,C), the projections' scratch
//   backward: dln1 (N,C), datty (N,NH*hd), dln2 (N,C), dh (N,I); accumulated: dq (N,NH*hd),
//     dk, dv (N,NKV*hd), Qwen3's dq_pre (N,NH*hd) and dk_pre (N,NKV*hd), dgate, dup (N,I)
//   sequence parallelism (sp > 1; N = B*T of the chunk): q and lse as above hold this rank's
//     heads of the whole sequence (the same sizes), k and v (N, KV_full), and atty_full
//     (N,NH*hd) is kept besides; the forward's shared scratch adds the all-to-alls' send and recv
//     (N * max(NH*hd, KV_full) each; one buffer for both at B == 1); dk and dv are (N, KV_full).
//     The chunk's q, k, v, datty, dq, dk and dv and their whole-sequence layouts share one buffer
//     each: every all-to-all reads its source into send before it writes the destination
//     (ulysses_exchange.h), so no tensor of the chunk and its whole-sequence twin are live at once.
Llama::Activations::Activations(const LlamaConfig& c, int sp_size)
    : widths{c.hidden_size,
             c.intermediate_size,
             c.head_dim,
             c.num_attention_heads,
             c.num_key_value_heads,
             c.num_attention_heads * c.head_dim,
             c.num_key_value_heads * c.head_dim},
      qk_norm(c.qk_norm()),
      heads(transformer::gqa_heads(c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                                   sp_size)) {}

void Llama::Activations::plan_forward(ActivationPlanner& p, const transformer::PassShape& s,
                                      const transformer::KeptSets& sets) {
  const auto& [C, I, hd, NH, NKV, Q, KV] = widths;
  const I64 N = s.N(), S = s.S;
  mlp_rows = transformer::swiglu_tile_rows(I, s.mlp_tile_setting, N, S);
  mlp_tiled = mlp_rows < N;
  const I64 mlp_rows_planned = mlp_rows;
  kept.assign(static_cast<std::size_t>(sets.count), Kept());
  for (Kept& a : kept) {
    p.bytes(&a.ln1, N * C * S);
    p.floats(&a.ln1_rstd, N);
    p.bytes(&a.q, N * Q * S);
    p.bytes(&a.k, N * heads.KV_full * S);
    p.bytes(&a.v, N * heads.KV_full * S);
    if (qk_norm) {
      p.bytes(&a.q_pre, N * Q * S);
      p.bytes(&a.k_pre, N * KV * S);
      p.floats(&a.q_rstd, N * NH);
      p.floats(&a.k_rstd, N * NKV);
    }
    p.floats(&a.lse, I64{s.B} * NH * s.T);
    p.bytes(&a.atty, N * Q * S);
    if (heads.sp > 1) p.bytes(&a.atty_full, N * Q * S);
    p.bytes(&a.res2, N * C * S);
    p.bytes(&a.ln2, N * C * S);
    p.floats(&a.ln2_rstd, N);
    if (mlp_tiled) continue;
    p.bytes(&a.gate, N * I * S);
    p.bytes(&a.up, N * I * S);
    p.bytes(&a.h, N * I * S);
  }
  p.bytes(&proj, N * C * S);
  transformer::plan_gqa_exchange(p, heads, s, &send, &recv);
  if (mlp_tiled) {
    p.bytes(&tile_gate, mlp_rows_planned * I * S);
    p.bytes(&tile_up, mlp_rows_planned * I * S);
    p.bytes(&tile_h, mlp_rows_planned * I * S);
  }
}

void Llama::Activations::plan_backward(ActivationPlanner& p, const transformer::PassShape& s) {
  const I64 NS = s.N() * s.S;
  p.bytes(&dln1, NS * widths.C);
  p.bytes(&datty, NS * widths.Q);
  p.bytes(&dln2, NS * widths.C);
  if (!mlp_tiled) {
    p.bytes(&dh, NS * widths.I);
    return;
  }
  // One tile's: swiglu_backward accumulates into dgate and dup, zeroed per tile.
  const I64 tile = I64{mlp_rows} * s.S * widths.I;
  p.bytes(&dh, tile);
  p.bytes(&dgate, tile);
  p.bytes(&dup, tile);
}

void Llama::Activations::plan_accumulated(ActivationPlanner& p, const transformer::PassShape& s) {
  const I64 NS = s.N() * s.S;
  // Under sequence parallelism dk and dv hold this rank's key/value heads of the whole sequence
  // first (KV_full, wider than the chunk's KV when key/value heads are shared out).
  p.bytes(&dq, NS * widths.Q);
  p.bytes(&dk, NS * heads.KV_full);
  p.bytes(&dv, NS * heads.KV_full);
  if (qk_norm) {
    p.bytes(&dq_pre, NS * widths.Q);
    p.bytes(&dk_pre, NS * widths.KV);
  }
  if (!mlp_tiled) {  // tiled: one tile's, in plan_backward
    p.bytes(&dgate, NS * widths.I);
    p.bytes(&dup, NS * widths.I);
  }
}

std::int64_t Llama::activation_bytes(const LlamaConfig& config, int B, int T, DType dtype,
                                     bool activation_checkpointing) {
  transformer::TransformerOptions options;
  options.activation_checkpointing = activation_checkpointing;
  return activation_bytes(config, B, T, dtype, options);
}

std::int64_t Llama::activation_bytes(const LlamaConfig& config, int B, int T, DType dtype,
                                     const LlamaOptions& options) {
  Activations scratch(config, options.sequence_parallel_size());
  return TransformerModel::activation_bytes(transformer_spec(config), options, B, T, dtype,
                                            scratch) +
         kActivationAlign;
}

std::int64_t Llama::host_activation_bytes(const LlamaConfig& config, int B, int T, DType dtype,
                                          const LlamaOptions& options) {
  return TransformerModel::host_activation_bytes(transformer_spec(config), options, B, T, dtype);
}

void Llama::block_forward(ParamAccess& a, int layer, Bytes res_in, Bytes res_out) {
  const Pass& pass = this->pass();
  const Activations::Kept& x = acts_.kept[kept_set(layer)];
  const auto& [C, I, hd, NH, NKV, Q, KV] = acts_.widths;
  const int N = pass.N();
  const DType dt = pass.dtype;
  kernels::KernelContext& ctx = this->ctx();
  auto P = [&](int slot) {
    const int index = block_param(layer, slot);
    return index < 0 ? Bytes() : a.param(index);
  };
  // Under sequence parallelism q, k, v hold the chunk's rows until the all-to-alls turn them, in
  // place, into this rank's heads of the whole sequence (gqa_attention_forward).
  const Bytes q = x.q, k = x.k, v = x.v;
  const double eps = config_.rms_norm_eps;
  k::rmsnorm_forward(ctx, dt, x.ln1, x.ln1_rstd, res_in, P(kLn1W), N, C, eps);
  // Qwen3 normalises each head of q and k (rows of hd) between the projection and the rotation.
  const bool qk_norm = acts_.qk_norm;
  k::linear_forward(ctx, dt, qk_norm ? x.q_pre : q, x.ln1, P(kQW), P(kQB), N, C, Q);
  k::linear_forward(ctx, dt, qk_norm ? x.k_pre : k, x.ln1, P(kKW), P(kKB), N, C, KV);
  k::linear_forward(ctx, dt, v, x.ln1, P(kVW), P(kVB), N, C, KV);
  if (qk_norm) {
    k::rmsnorm_forward(ctx, dt, q, x.q_rstd, x.q_pre, P(kQNormW), N * NH, hd, eps);
    k::rmsnorm_forward(ctx, dt, k, x.k_rstd, x.k_pre, P(kKNormW), N * NKV, hd, eps);
  }
  k::rope_forward(ctx, dt, q, q, rope_, pass.B, pass.T, NH, hd, pass.positions);
  k::rope_forward(ctx, dt, k, k, rope_, pass.B, pass.T, NKV, hd, pass.positions);
  gqa_attention_forward(acts_.heads, attention_tensors(x), acts_.send, acts_.recv,
                        config_.layer_window(layer));
  k::linear_forward(ctx, dt, acts_.proj, x.atty, P(kOW), Bytes(), N, Q, C);
  k::residual_rmsnorm_forward(ctx, dt, x.res2, x.ln2, x.ln2_rstd, res_in, acts_.proj, P(kLn2W), N,
                              C, eps);
  if (acts_.mlp_tiled) {
    // The rerun under checkpointing leaves the MLP to the backward, which recomputes it per tile.
    if (!res_out) return;
    transformer::swiglu_mlp_tiled_forward(ctx, dt, mlp_weights(a, layer, false), mlp_tile(), x.ln2,
                                          acts_.proj, N, C, I);
    k::residual_forward(ctx, dt, res_out, x.res2, acts_.proj, I64{N} * C);
    return;
  }
  k::linear_forward(ctx, dt, x.gate, x.ln2, P(kGateW), Bytes(), N, C, I);
  k::linear_forward(ctx, dt, x.up, x.ln2, P(kUpW), Bytes(), N, C, I);
  k::swiglu_forward(ctx, dt, x.h, x.gate, x.up, I64{N} * I);
  if (res_out) {
    k::linear_forward(ctx, dt, acts_.proj, x.h, P(kDownW), Bytes(), N, I, C);
    k::residual_forward(ctx, dt, res_out, x.res2, acts_.proj, I64{N} * C);
  }
}

// On entry dres() holds the gradient of the block's output; on exit that of its input
// (the residual adds' backward happens in place: the branch projections read dres as their
// output gradient and the RMSNorms accumulate into it).
void Llama::block_backward(ParamAccess& a, int layer, Bytes res_in) {
  const Pass& pass = this->pass();
  const Activations::Kept& x = acts_.kept[kept_set(layer)];
  const auto& [C, I, hd, NH, NKV, Q, KV] = acts_.widths;
  const int N = pass.N();
  const DType dt = pass.dtype, gt = pass.grad_dtype;
  kernels::KernelContext& ctx = this->ctx();
  auto P = [&](int slot) { return a.param(block_param(layer, slot)); };
  // A parameter's gradient, null where the block has no such parameter or it is frozen: the
  // kernels then skip its work (a projection's GEMM, a norm's column sums), and a frozen
  // parameter needs no gradient buffer (Model::skips_frozen_gradients).
  auto G = [&](int slot) { return trained_grad(a, block_param(layer, slot)); };
  const Activations& d = acts_;
  const Bytes dres = this->dres();
  // The first projection into dh, dln2, datty and dln1 overwrites it; the next ones add.
  const k::GradWrite first = k::GradWrite::kOverwrite;
  if (d.mlp_tiled) {
    transformer::swiglu_mlp_tiled_backward(ctx, dt, gt, mlp_weights(a, layer, false),
                                           mlp_weights(a, layer, true), mlp_tile(), x.ln2, dres,
                                           d.dln2, N, C, I);
  } else {
    k::linear_backward(ctx, dt, gt, d.dh, G(kDownW), Bytes(), dres, x.h, P(kDownW), N, I, C, first);
    k::swiglu_backward(ctx, dt, d.dgate, d.dup, d.dh, x.gate, x.up, I64{N} * I);
    k::linear_backward(ctx, dt, gt, d.dln2, G(kGateW), Bytes(), d.dgate, x.ln2, P(kGateW), N, C, I,
                       first);
    k::linear_backward(ctx, dt, gt, d.dln2, G(kUpW), Bytes(), d.dup, x.ln2, P(kUpW), N, C, I);
  }
  k::rmsnorm_backward(ctx, dt, gt, dres, G(kLn2W), d.dln2, x.res2, P(kLn2W), x.ln2_rstd, N, C);
  k::linear_backward(ctx, dt, gt, d.datty, G(kOW), Bytes(), dres, x.atty, P(kOW), N, Q, C, first);
  gqa_attention_backward(d.heads, attention_tensors(x), {d.dq, d.dk, d.dv, d.datty}, d.send, d.recv,
                         config_.layer_window(layer));
  k::rope_backward(ctx, dt, d.dq, d.dq, rope_, pass.B, pass.T, NH, hd, pass.positions);
  k::rope_backward(ctx, dt, d.dk, d.dk, rope_, pass.B, pass.T, NKV, hd, pass.positions);
  Bytes dq = d.dq, dk = d.dk;
  if (d.qk_norm) {  // through the per-head RMSNorms to the projections' outputs
    k::rmsnorm_backward(ctx, dt, gt, d.dq_pre, G(kQNormW), d.dq, x.q_pre, P(kQNormW), x.q_rstd,
                        N * NH, hd);
    k::rmsnorm_backward(ctx, dt, gt, d.dk_pre, G(kKNormW), d.dk, x.k_pre, P(kKNormW), x.k_rstd,
                        N * NKV, hd);
    dq = d.dq_pre;
    dk = d.dk_pre;
  }
  k::linear_backward(ctx, dt, gt, d.dln1, G(kQW), G(kQB), dq, x.ln1, P(kQW), N, C, Q, first);
  k::linear_backward(ctx, dt, gt, d.dln1, G(kKW), G(kKB), dk, x.ln1, P(kKW), N, C, KV);
  k::linear_backward(ctx, dt, gt, d.dln1, G(kVW), G(kVB), d.dv, x.ln1, P(kVW), N, C, KV);
  k::rmsnorm_backward(ctx, dt, gt, dres, G(kLn1W), d.dln1, res_in, P(kLn1W), x.ln1_rstd, N, C);
}

transformer::TransformerModel::GqaTensors Llama::attention_tensors(const Activations::Kept& x) {
  return {x.q, x.k, x.v, x.atty, x.atty_full, x.lse};
}

transformer::SwigluWeights Llama::mlp_weights(ParamAccess& a, int layer, bool grads) const {
  auto get = [&](int slot) {
    const int index = block_param(layer, slot);
    return grads ? trained_grad(a, index) : a.param(index);
  };
  return {get(kGateW), get(kUpW), get(kDownW)};
}

transformer::SwigluTile Llama::mlp_tile() const {
  return {acts_.mlp_rows, acts_.tile_gate, acts_.tile_up, acts_.tile_h,
          acts_.dh,       acts_.dgate,     acts_.dup};
}

}  // namespace zrt::llama
