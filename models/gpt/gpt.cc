#include "models/gpt/gpt.h"

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "kernels/ops.h"
#include "models/activation_planner.h"
#include "models/init_rng.h"
#include "runtime/common/error.h"

namespace zrt::gpt {

namespace k = zrt::kernels;

namespace {

using I64 = std::int64_t;

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

// The driver's view of a Gpt of `config`, once `config` is valid.
transformer::TransformerSpec transformer_spec(const GptConfig& config) {
  config.validate();
  transformer::TransformerSpec spec;
  spec.family = "gpt";
  spec.architecture = "gpt";
  spec.final_norm = transformer::NormKind::kLayerNorm;
  spec.n_layer = config.n_layer;
  spec.hidden_size = config.n_embd;
  spec.vocab_size = config.vocab_size;
  spec.seq_len = config.seq_len;
  spec.token_embedding = 0;
  spec.position_embedding = 1;
  spec.final_norm_weight = 2 + config.n_layer * Gpt::kBlockParams;
  spec.final_norm_bias = spec.final_norm_weight + 1;
  spec.head = spec.token_embedding;  // tied
  return spec;
}

}  // namespace

transformer::SequenceParallelShape Gpt::sequence_parallel_shape(const GptConfig& c) {
  transformer::SequenceParallelShape shape;
  shape.query_heads = c.n_head;
  shape.query_heads_name = "heads (n_head)";
  shape.seq_len = c.seq_len;
  return shape;
}

std::vector<std::string> Gpt::sequence_parallel_problems(const GptConfig& c, int sp) {
  return transformer::sequence_parallel_problems(sequence_parallel_shape(c), sp);
}

namespace {

// The model's config, after refusing a sequence-parallel group it cannot use.
const GptConfig& checked_gpt_config(const GptConfig& c, const GptOptions& options) {
  transformer::require_sequence_parallel_fits(c.name, Gpt::sequence_parallel_shape(c),
                                              options.sequence_parallel_size());
  return c;
}

}  // namespace

Gpt::Gpt(GptConfig config, kernels::KernelContext& ctx, GptOptions options)
    : TransformerModel(ctx, transformer_spec(checked_gpt_config(config, options)), options),
      config_(std::move(config)),
      params_(parameter_table(config_)),
      acts_(config_, options.sequence_parallel_size()) {}

std::vector<ParamSpec> Gpt::parameter_table(const GptConfig& config) {
  std::vector<ParamSpec> params;
  const I64 C = config.n_embd;
  const int L = config.n_layer;
  const int final_module = transformer::head_module(L);
  const int embedding = transformer::kEmbeddingModule;
  params.push_back(
      {"transformer.wte.weight", {config.vocab_size, C}, {embedding, final_module}, false});
  params.push_back({"transformer.wpe.weight", {config.seq_len, C}, {embedding}, false});
  for (int l = 0; l < L; ++l) {
    const std::string p = "transformer.h." + std::to_string(l) + ".";
    const std::vector<int> m = {transformer::block_module(l)};
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
  const ParamSpec& spec = init_range(index, begin, count);
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

// The blocks' part of the layout at sp > 1 (N = B*T of the chunk): qkv and att_lse as at sp 1
// hold this rank's heads of the whole sequence (the same sizes), atty_full (N,C) is kept besides;
// the forward's shared scratch adds the all-to-alls' send and recv (N,3C each; one buffer for
// both at B == 1). qkv, datty and
// dqkv hold the chunk's layout and the whole sequence's in turn, in place (each all-to-all reads
// its source into send before it writes the destination, ulysses_exchange.h).
void Gpt::Activations::plan_forward(ActivationPlanner& p, const transformer::PassShape& s,
                                    const transformer::KeptSets& sets) {
  const I64 N = s.N(), S = s.S;
  const I64 C = config_.n_embd;
  const I64 NH = config_.n_head;
  kept.assign(static_cast<std::size_t>(sets.count), Kept());
  for (Kept& a : kept) {
    p.bytes(&a.ln1, N * C * S);
    p.floats(&a.ln1_mean, N);
    p.floats(&a.ln1_rstd, N);
    p.bytes(&a.qkv, N * 3 * C * S);
    p.floats(&a.att_lse, I64{s.B} * NH * s.T);
    p.bytes(&a.atty, N * C * S);
    if (sp > 1) p.bytes(&a.atty_full, N * C * S);
    p.bytes(&a.attproj, N * C * S);
    p.bytes(&a.res2, N * C * S);
    p.bytes(&a.ln2, N * C * S);
    p.floats(&a.ln2_mean, N);
    p.floats(&a.ln2_rstd, N);
    p.bytes(&a.fch, N * 4 * C * S);
    p.bytes(&a.fch_gelu, N * 4 * C * S);
    p.bytes(&a.fcproj, N * C * S);
  }
  if (sp > 1) {
    p.bytes(&send, N * 3 * C * S);
    // At B == 1 each exchange uses only one of the two (ulysses_exchange.h).
    if (s.B == 1) {
      p.alias(&recv, &send);
    } else {
      p.bytes(&recv, N * 3 * C * S);
    }
  }
}

void Gpt::Activations::plan_backward(ActivationPlanner& p, const transformer::PassShape& s) {
  const I64 N = s.N(), S = s.S;
  const I64 C = config_.n_embd;
  // Without sequence parallelism attention's backward is dqkv's one producer and overwrites it
  // (GradWrite::kOverwrite: cuDNN's in place, no zeroing); with it, plan_accumulated's.
  if (sp == 1) p.bytes(&dqkv, N * 3 * C * S);
  p.bytes(&dln1, N * C * S);
  p.bytes(&datty, N * C * S);
  p.bytes(&dln2, N * C * S);
  p.bytes(&dfch_gelu, N * 4 * C * S);
  p.bytes(&dfch, N * 4 * C * S);
}

void Gpt::Activations::plan_accumulated(ActivationPlanner& p, const transformer::PassShape& s) {
  if (sp > 1) p.bytes(&dqkv, s.N() * 3 * config_.n_embd * s.S);
}

std::int64_t Gpt::planned_activation_bytes(const GptConfig& config, const GptOptions& options,
                                           int B, int T, DType dtype) {
  Activations scratch(config, options.sequence_parallel_size());
  return TransformerModel::activation_bytes(transformer_spec(config), options, B, T, dtype,
                                            scratch) +
         kActivationAlign;
}

std::int64_t Gpt::activation_bytes(int B, int T, DType dtype) const {
  Activations scratch(config_, acts_.sp);
  return TransformerModel::activation_bytes(spec(), options(), B, T, dtype, scratch);
}

void Gpt::block_forward(ParamAccess& a, int layer, Bytes res_in, Bytes res_out) {
  const Pass& pass = this->pass();
  const Activations::Kept& x = acts_.kept[kept_set(layer)];
  const int N = pass.N();
  const int C = config_.n_embd;
  const DType dt = pass.dtype;
  kernels::KernelContext& ctx = this->ctx();
  auto P = [&](int slot) { return a.param(block_param(layer, slot)); };
  // Under sequence parallelism qkv holds the chunk's projection until the all-to-all turns it,
  // in place, into this rank's heads of the whole sequence (attention_forward).
  const Bytes qkv = x.qkv;
  k::layernorm_forward(ctx, dt, x.ln1, x.ln1_mean, x.ln1_rstd, res_in, P(kLn1W), P(kLn1B), N, C);
  k::matmul_forward(ctx, dt, qkv, x.ln1, P(kQkvW), P(kQkvB), N, C, 3 * C);
  attention_forward(x);
  k::matmul_forward(ctx, dt, x.attproj, x.atty, P(kAttProjW), P(kAttProjB), N, C, C);
  k::residual_layernorm_forward(ctx, dt, x.res2, x.ln2, x.ln2_mean, x.ln2_rstd, res_in, x.attproj,
                                P(kLn2W), P(kLn2B), N, C);
  k::matmul_gelu_forward(ctx, dt, x.fch_gelu, x.fch, x.ln2, P(kFcW), P(kFcB), N, C, 4 * C);
  k::matmul_forward(ctx, dt, x.fcproj, x.fch_gelu, P(kFcProjW), P(kFcProjB), N, 4 * C, C);
  if (res_out) k::residual_forward(ctx, dt, res_out, x.res2, x.fcproj, I64{N} * C);
}

// On entry dres() holds the gradient of the block's output; on exit that of its input.
// The residual adds' backward (d_in += d_out, d_branch = d_out) happens in place: the branch
// projections read dres as their output gradient and the LayerNorms accumulate into it.
void Gpt::block_backward(ParamAccess& a, int layer, Bytes res_in) {
  const Pass& pass = this->pass();
  const Activations::Kept& x = acts_.kept[kept_set(layer)];
  const int N = pass.N();
  const int C = config_.n_embd;
  const DType dt = pass.dtype;
  const DType gt = pass.grad_dtype;
  kernels::KernelContext& ctx = this->ctx();
  auto P = [&](int slot) { return a.param(block_param(layer, slot)); };
  // A parameter's gradient, null where the block has no such parameter or it is frozen: the
  // kernels then skip its work (a projection's GEMM, a norm's column sums), and a frozen
  // parameter needs no gradient buffer (Model::skips_frozen_gradients).
  auto G = [&](int slot) { return trained_grad(a, block_param(layer, slot)); };
  const Activations& d = acts_;
  const Bytes dres = this->dres();
  const k::GradWrite once = k::GradWrite::kOverwrite;
  // dfch = gelu'(fch) * (dres @ W_fcproj^T), overwritten; dfch_gelu is the unfused path's scratch.
  k::matmul_dgelu_backward(ctx, dt, gt, d.dfch, d.dfch_gelu, G(kFcProjW), G(kFcProjB), dres,
                           x.fch_gelu, P(kFcProjW), x.fch, N, 4 * C, C);
  k::matmul_backward(ctx, dt, gt, d.dln2, G(kFcW), G(kFcB), d.dfch, x.ln2, P(kFcW), N, C, 4 * C,
                     once);
  k::layernorm_backward(ctx, dt, gt, dres, G(kLn2W), G(kLn2B), d.dln2, x.res2, P(kLn2W), x.ln2_mean,
                        x.ln2_rstd, N, C);
  k::matmul_backward(ctx, dt, gt, d.datty, G(kAttProjW), G(kAttProjB), dres, x.atty, P(kAttProjW),
                     N, C, C, once);
  attention_backward(x);
  k::matmul_backward(ctx, dt, gt, d.dln1, G(kQkvW), G(kQkvB), d.dqkv, x.ln1, P(kQkvW), N, C, 3 * C,
                     once);
  k::layernorm_backward(ctx, dt, gt, dres, G(kLn1W), G(kLn1B), d.dln1, res_in, P(kLn1W), x.ln1_mean,
                        x.ln1_rstd, N, C);
}

void Gpt::attention_forward(const Activations::Kept& x) {
  const Pass& pass = this->pass();
  const int C = config_.n_embd, NH = config_.n_head;
  const DType dt = pass.dtype;
  transformer::UlyssesExchange* ex = ulysses();
  if (ex == nullptr) {
    k::attention_forward(ctx(), dt, x.atty, x.att_lse, x.qkv, pass.B, pass.T, C, NH,
                         pass.doc_start);
    return;
  }
  // The chunk's packed q, k, v to this rank's heads of the whole sequences (still packed, so
  // the attention reads them as at sp 1 with NH/sp heads of C/sp), attention over them
  // (doc_start spans the whole sequences), and the output back to every head of the chunk.
  const Activations& a = acts_;
  const int sp = ex->size(), hs = C / NH;
  ex->to_heads_packed(dt, x.qkv, x.qkv, pass.B, pass.T, 3, NH, hs, a.send, a.recv);
  k::attention_forward(ctx(), dt, x.atty_full, x.att_lse, x.qkv, pass.B, pass.sequence_length(),
                       C / sp, NH / sp, pass.doc_start);
  ex->to_chunk(dt, x.atty, x.atty_full, pass.B, pass.T, NH, hs, a.send, a.recv);
}

// datty holds the output's gradient; dqkv receives qkv's. Without sequence parallelism attention
// is its one producer: kOverwrite, so cuDNN's attention writes it in place and nothing zeroes it
// first (zrt's kernels, which accumulate, zero it themselves). Under it the driver zeroes dqkv
// with the accumulated region (kIntoZeros: cuDNN's still writes in place).
void Gpt::attention_backward(const Activations::Kept& x) {
  const Pass& pass = this->pass();
  const int C = config_.n_embd, NH = config_.n_head;
  const DType dt = pass.dtype;
  const Activations& d = acts_;
  transformer::UlyssesExchange* ex = ulysses();
  if (ex == nullptr) {
    k::attention_backward(ctx(), dt, d.dqkv, d.datty, x.qkv, x.atty, x.att_lse, pass.B, pass.T, C,
                          NH, pass.doc_start, /*window=*/0, k::GradWrite::kOverwrite);
    return;
  }
  const int sp = ex->size(), hs = C / NH;
  // datty and dqkv change layout in place: attention accumulates into dqkv (zeroed by the
  // driver) over the whole sequence, and the adjoint turns it into the chunk's.
  ex->to_chunk_backward(dt, d.datty, d.datty, pass.B, pass.T, NH, hs, d.send, d.recv);
  k::attention_backward(ctx(), dt, d.dqkv, d.datty, x.qkv, x.atty_full, x.att_lse, pass.B,
                        pass.sequence_length(), C / sp, NH / sp, pass.doc_start, /*window=*/0,
                        k::GradWrite::kIntoZeros);
  ex->to_heads_packed_backward_in_place(dt, d.dqkv, pass.B, pass.T, 3, NH, hs, d.send, d.recv);
}

}  // namespace zrt::gpt
