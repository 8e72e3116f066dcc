#include "models/moe/moe_model.h"

#include <algorithm>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "kernels/moe_ops.h"
#include "kernels/ops.h"
#include "models/activation_planner.h"
#include "models/init_rng.h"
#include "models/transformer/sequence_parallel_shape.h"
#include "models/transformer/tiling.h"
#include "runtime/common/error.h"
#include "runtime/device/device.h"

namespace zrt::moe {

namespace k = zrt::kernels;

namespace {

using I64 = std::int64_t;

constexpr double kInitStd = 0.02;  // transformers' initializer_range default

struct BlockParam {
  BlockParam(MoeModel::Slot slot_, std::string name_, std::vector<I64> shape_, int expert_ = -1,
             std::string fused_ = "")
      : slot(slot_),
        name(std::move(name_)),
        shape(std::move(shape_)),
        expert(expert_),
        fused(std::move(fused_)) {}
  MoeModel::Slot slot;
  std::string name;
  std::vector<I64> shape;
  // An expert's own parameter (expert parallelism): its global index, and the fused parameter
  // (name in the block) whose rows [expert x numel, ...) it is; -1 and "" for any other.
  int expert;
  std::string fused;
};

// Block `l`'s parameters in transformers v5's state-dict order (named_parameters()); under
// expert parallelism (experts.ep_size > 1) the fused experts replaced by the local experts' own
// parameters, the gate_up of each then the down of each (moe_model.h).
std::vector<BlockParam> block_params(const MoeConfig& c, int l, const ExpertPartition& experts) {
  using M = MoeModel;
  const I64 C = c.hidden_size, I = c.intermediate_size, Ie = c.moe_intermediate_size;
  const I64 E = c.num_experts, Is = c.shared_expert_intermediate_size;
  const I64 Q = I64{c.num_attention_heads} * c.head_dim;
  const I64 KV = I64{c.num_key_value_heads} * c.head_dim;
  std::vector<BlockParam> b;
  b.push_back({M::kQW, "self_attn.q_proj.weight", {Q, C}});
  if (c.attention_bias) b.push_back({M::kQB, "self_attn.q_proj.bias", {Q}});
  b.push_back({M::kKW, "self_attn.k_proj.weight", {KV, C}});
  if (c.attention_bias) b.push_back({M::kKB, "self_attn.k_proj.bias", {KV}});
  b.push_back({M::kVW, "self_attn.v_proj.weight", {KV, C}});
  if (c.attention_bias) b.push_back({M::kVB, "self_attn.v_proj.bias", {KV}});
  b.push_back({M::kOW, "self_attn.o_proj.weight", {C, Q}});
  if (c.qk_norm()) {
    b.push_back({M::kQNorm, "self_attn.q_norm.weight", {c.head_dim}});
    b.push_back({M::kKNorm, "self_attn.k_norm.weight", {c.head_dim}});
  }
  const BlockParam router{M::kRouter, "mlp.gate.weight", {E, C}};
  const BlockParam gate_up{M::kGateUp, "mlp.experts.gate_up_proj", {E, 2 * Ie, C}};
  const BlockParam down{M::kDown, "mlp.experts.down_proj", {E, C, Ie}};
  std::vector<BlockParam> routed{gate_up, down};
  if (experts.ep_size > 1) {
    routed.clear();
    for (const BlockParam& fused : {gate_up, down}) {
      for (int e = experts.first_local(); e < experts.first_local() + experts.local(); ++e) {
        const std::string kind = fused.slot == M::kGateUp ? "gate_up_proj" : "down_proj";
        routed.push_back({fused.slot,
                          "mlp.experts." + std::to_string(e) + "." + kind,
                          {fused.shape[1], fused.shape[2]},
                          e,
                          fused.name});
      }
    }
  }
  if (!c.is_moe_layer(l)) {
    b.push_back({M::kDenseGate, "mlp.gate_proj.weight", {I, C}});
    b.push_back({M::kDenseUp, "mlp.up_proj.weight", {I, C}});
    b.push_back({M::kDenseDown, "mlp.down_proj.weight", {C, I}});
  } else if (c.architecture == "qwen3_moe") {
    b.insert(b.end(), routed.begin(), routed.end());
    b.push_back(router);
  } else {
    b.push_back(router);
    b.insert(b.end(), routed.begin(), routed.end());
    if (c.has_shared_expert()) {
      b.push_back({M::kSharedGateProj, "mlp.shared_expert.gate_proj.weight", {Is, C}});
      b.push_back({M::kSharedUpProj, "mlp.shared_expert.up_proj.weight", {Is, C}});
      b.push_back({M::kSharedDownProj, "mlp.shared_expert.down_proj.weight", {C, Is}});
      b.push_back({M::kSharedExpertGate, "mlp.shared_expert_gate.weight", {1, C}});
    }
  }
  b.push_back({M::kLn1, "input_layernorm.weight", {C}});
  b.push_back({M::kLn2, "post_attention_layernorm.weight", {C}});
  return b;
}

transformer::TransformerSpec transformer_spec(const MoeConfig& c, const ExpertPartition& experts) {
  c.validate();
  transformer::TransformerSpec spec;
  spec.family = "moe";
  spec.architecture = c.architecture;
  spec.final_norm = transformer::NormKind::kRmsNorm;
  spec.norm_eps = c.rms_norm_eps;
  spec.n_layer = c.num_hidden_layers;
  spec.hidden_size = c.hidden_size;
  spec.vocab_size = c.vocab_size;
  spec.seq_len = c.seq_len;
  spec.token_embedding = 0;
  spec.position_embedding = -1;
  int index = 1;
  for (int l = 0; l < c.num_hidden_layers; ++l)
    index += static_cast<int>(block_params(c, l, experts).size());
  spec.final_norm_weight = index;
  spec.head = c.tie_word_embeddings ? spec.token_embedding : index + 1;
  return spec;
}

MoeLayerShape layer_shape(const MoeConfig& c) {
  MoeLayerShape s;
  s.C = c.hidden_size;
  s.E = c.num_experts;
  s.k = c.num_experts_per_tok;
  s.I = c.moe_intermediate_size;
  s.Is = c.shared_expert_intermediate_size;
  s.renormalize = c.norm_topk_prob;
  s.capacity_factor = c.capacity_factor;
  return s;
}

kernels::RopeTable moe_rope_table(const MoeConfig& c) {
  return kernels::make_rope_table(c.head_dim, c.rope_theta, c.rope_scaling.params());
}

// This rank's experts: all of them without an expert group, else its block of the group's.
ExpertPartition expert_partition(const MoeConfig& c, const MoeOptions& options) {
  ExpertPartition experts{c.num_experts, 1, 0};
  if (options.expert_parallel_size() > 1) {
    experts.ep_size = options.expert_group->size();
    experts.ep_rank = options.expert_group->rank();
    experts.check();
  }
  return experts;
}

std::unique_ptr<ExpertDispatch> make_expert_dispatch(kernels::KernelContext& ctx,
                                                     const ExpertPartition& experts,
                                                     const MoeOptions& options) {
  if (experts.ep_size == 1) return nullptr;
  return std::make_unique<ExpertDispatch>(ctx.device(), ctx.stream(), *options.expert_group,
                                          experts.num_experts);
}

// Which of the blocks' kept sets serve an MoE block (those hold ExpertRows' kept rows).
std::vector<bool> serves_moe_layer(const MoeConfig& c, const transformer::KeptSets& sets) {
  std::vector<bool> serves(static_cast<std::size_t>(sets.count), false);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    if (c.is_moe_layer(l)) serves[static_cast<std::size_t>(sets.of_layer[l])] = true;
  }
  return serves;
}

ExpertRowsShape expert_rows_shape(const MoeConfig& c, int ep) {
  return {c.hidden_size, c.moe_intermediate_size, c.num_experts_per_tok, c.num_experts, ep};
}

std::unique_ptr<ExpertRows> make_expert_rows(kernels::KernelContext& ctx, const MoeConfig& c,
                                             const ExpertPartition& experts,
                                             const MoeOptions& options) {
  if (experts.ep_size == 1) return nullptr;
  return std::make_unique<ExpertRows>(ctx.device(), ctx.stream(), options.expert_group->stream(),
                                      expert_rows_shape(c, experts.ep_size),
                                      options.expert_rows_reserve);
}

transformer::SequenceParallelShape moe_sequence_parallel_shape(const MoeConfig& c) {
  transformer::SequenceParallelShape shape;
  shape.query_heads = c.num_attention_heads;
  shape.query_heads_name = "query heads (num_attention_heads)";
  shape.key_value_heads = c.num_key_value_heads;
  shape.seq_len = c.seq_len;
  return shape;
}

// `config` after refusing a sequence-parallel group the model cannot use: the attention's heads
// must split (as the Llama family's).
const MoeConfig& checked_moe_config(const MoeConfig& c, const MoeOptions& options) {
  const int sp = options.sequence_parallel_size();
  if (sp <= 1) return c;
  transformer::require_sequence_parallel_fits(c.architecture, moe_sequence_parallel_shape(c), sp);
  return c;
}

}  // namespace

std::vector<std::string> MoeModel::sequence_parallel_problems(const MoeConfig& config, int sp) {
  return transformer::sequence_parallel_problems(moe_sequence_parallel_shape(config), sp);
}

MoeModel::MoeModel(MoeConfig config, kernels::KernelContext& ctx, MoeOptions options)
    : TransformerModel(
          ctx,
          transformer_spec(checked_moe_config(config, options), expert_partition(config, options)),
          options),
      config_(std::move(config)),
      experts_(expert_partition(config_, options)),
      dispatch_(make_expert_dispatch(ctx, experts_, options)),
      rows_(make_expert_rows(ctx, config_, experts_, options)),
      params_(parameter_table(config_, experts_)),
      rope_(moe_rope_table(config_)),
      layer_(layer_shape(config_), dispatch_.get(), rows_.get()),
      acts_(config_, experts_.ep_size, options.sequence_parallel_size()) {
  // Each parameter's initial values: its own, or an expert's rows of the ep-1 table's fused one.
  std::map<std::string, int> fused_index;
  const std::vector<ParamSpec> fused_table = parameter_table(config_);
  for (int i = 0; i < static_cast<int>(fused_table.size()); ++i) {
    fused_index[fused_table[static_cast<std::size_t>(i)].name] = i;
  }
  for (const ParamSpec& p : params_) {
    const auto found = fused_index.find(p.name);  // an expert's own: set below
    init_source_.emplace_back(found == fused_index.end() ? -1 : found->second, 0);
  }
  int index = 1;
  for (int l = 0; l < config_.num_hidden_layers; ++l) {
    std::array<int, kNumSlots> slots;
    slots.fill(-1);
    const std::string prefix = "model.layers." + std::to_string(l) + ".";
    for (const BlockParam& p : block_params(config_, l, experts_)) {
      // An expert's slot is its first local expert's parameter (the others follow it).
      if (slots[p.slot] < 0) slots[p.slot] = index;
      if (p.expert >= 0) {
        const I64 numel = p.shape[0] * p.shape[1];
        init_source_[static_cast<std::size_t>(index)] = {fused_index.at(prefix + p.fused),
                                                         p.expert * numel};
      }
      ++index;
    }
    slots_.push_back(slots);
    if (config_.is_moe_layer(l) && first_moe_layer_ < 0) first_moe_layer_ = l;
  }
  const I64 E = config_.num_experts;
  router_buffer_ = ctx.device().allocate(router_bytes(config_), MemCategory::kActivations,
                                         "moe router losses", MemorySpace::kDevice, &ctx.stream());
  const Bytes base = router_buffer_.device<std::byte>();
  const I64 vec = round_up_activation(E * 4);
  router_.stats_counts = base.as<float>();
  router_.stats_probsum = (base + vec).as<float>();
  router_.dprobs_shared = (base + 2 * vec).as<float>();
  router_.z_sum = (base + 3 * vec).as<float>();
  router_.z_scratch = (base + 3 * vec + kActivationAlign).as<float>();
  lb_ = (base + 3 * vec + 2 * kActivationAlign).as<float>();
  const int moe_layers = std::max(1, config_.num_moe_layers());
  router_.z_layer_weight = 1.0f / static_cast<float>(moe_layers);
  ctx.device().fill_zero(base, static_cast<std::size_t>(router_bytes(config_)), ctx.stream());
  expert_tokens_.assign(static_cast<std::size_t>(config_.num_moe_layers() * E), 0);
  pass_tokens_ = expert_tokens_;
}

std::int64_t MoeModel::sequence_group_sum_floats(const MoeConfig& c) {
  return 2 * round_up_activation(I64{c.num_experts} * 4) / 4;
}

std::int64_t MoeModel::router_bytes(const MoeConfig& c) {
  return 3 * round_up_activation(I64{c.num_experts} * 4) + 3 * kActivationAlign;
}

std::vector<ParamSpec> MoeModel::parameter_table(const MoeConfig& c,
                                                 const ExpertPartition& experts) {
  std::vector<ParamSpec> params;
  const I64 C = c.hidden_size;
  const int L = c.num_hidden_layers;
  const int head_module = transformer::head_module(L);
  std::vector<int> embed_modules = {transformer::kEmbeddingModule};
  if (c.tie_word_embeddings) embed_modules.push_back(head_module);
  params.push_back({"model.embed_tokens.weight", {c.vocab_size, C}, embed_modules, false});
  for (int l = 0; l < L; ++l) {
    const std::string prefix = "model.layers." + std::to_string(l) + ".";
    for (const BlockParam& p : block_params(c, l, experts)) {
      params.push_back({prefix + p.name,
                        p.shape,
                        {transformer::block_module(l)},
                        p.shape.size() == 1,
                        p.expert >= 0 ? 1 : 0,
                        false,
                        p.fused.empty() ? std::string() : prefix + p.fused});
    }
  }
  params.push_back({"model.norm.weight", {C}, {head_module}, true});
  if (!c.tie_word_embeddings) {
    params.push_back({"lm_head.weight", {c.vocab_size, C}, {head_module}, false});
  }
  return params;
}

void MoeModel::init_parameter(int index, std::uint64_t seed, std::int64_t begin, std::int64_t count,
                              float* out) const {
  const ParamSpec& spec = init_range(index, begin, count);
  if (spec.shape.size() == 1) {  // biases 0, RMSNorm weights 1
    const bool norm_weight = spec.name.find("norm.weight") != std::string::npos;
    for (I64 i = 0; i < count; ++i) out[i] = norm_weight ? 1.0f : 0.0f;
    return;
  }
  const auto& [source, offset] = init_source_[static_cast<std::size_t>(index)];
  fill_counter_normal(seed, static_cast<std::uint64_t>(source), offset + begin, count, kInitStd,
                      out);
}

// The blocks' part of the layout (S bytes per element of the compute dtype, N = B*T, statistics
// fp32, indices int32; "any dense" / "any MoE": present when some block is of that kind; Nd and
// Nm the rows the dense MLP and the MoE layer take at a time: N, or a tile's rows when tiled):
//   kept (KeptSets: L sets, fewer below the first block with a backward, or 1 under
//     checkpointing): ln1 (N,C), ln1 rstd (N), q (N,Q), k, v (N,KV); with
//     q/k norms the pre-norm q, k and their rstd (N*NH), (N*NKV); lse (B,NH,T); atty (N,Q); res2,
//     ln2 (N,C), ln2 rstd (N); any dense, untiled: gate, up, h (N,I); any MoE, untiled: the MoE
//     set below at N rows
//   the MoE set (MoeKept) of Nm rows: logits (Nm,E), probs (Nm,E) fp32, weights (Nm,k) fp32,
//     experts, routed (with a capacity factor), row_of (Nm,k) int32, xe (Nm*k,C), gate, up, h
//     (Nm*k,Ie), y (Nm*k,C), with a shared expert sgate, sup, sh (Nm,Is), sout (Nm,C), slogit (Nm)
//     (under expert parallelism xe is one (Nm*k,C) buffer the blocks share, planned before the
//     sets: the rows leave for their experts and the backward reads the copy received, xl; and
//     gate, up, h and xl hold the rows this rank's experts receive: ExpertRows' kept sets,
//     outside this layout, as is every (R, .) scratch below: the exchanges' staging and rows,
//     dh, dgate, dup; models/moe/expert_rows.h)
//   then proj (N,C); tiled dense MLP: its tile's gate, up, h (Nd,I); tiled MoE: the tile's MoE set
//     (every layer's tiles in turn); any MoE: the plan's counts (E), offsets (E+1), source
//     (Nm*k) int32; with a capacity factor at sp > 1 every rank's routing counts (sp,B,E) int32
//   backward: dln1 (N,C), datty (N,Q), dln2 (N,C); any dense: dh (Nd,I), tiled: dgate, dup (Nd,I);
//     any MoE: dy (Nm*k,C), dh (Nm*k,Ie), dxe (Nm*k,C), dweights (Nm,k) fp32, dlogits (Nm,E);
//     shared: ds (Nm,C), dsh (Nm,Is), dslogit (Nm); tiled: dgate, dup (Nm*k,Ie) and the shared
//     expert's dsgate, dsup (Nm,Is), which the tiles zero before accumulating
//   accumulated: dq (N,Q), dk, dv (N,KV); q/k norms: dq_pre (N,Q), dk_pre (N,KV); any dense,
//     untiled: dgate, dup (N,I); any MoE, untiled: dgate, dup (N*k,Ie); shared: dsgate, dsup
//     (N,Is)
//   sequence parallelism (sp > 1; N = B*T of the chunk), as the Llama family's
//     (gqa_attention_block.h): k, v, dk, dv at (N, KV_full), the whole sequence's attention
//     output atty_full (N,Q) kept besides atty, and the all-to-alls' send and recv after proj
MoeModel::Activations::Activations(const MoeConfig& config, int expert_parallel_size,
                                   int sequence_parallel_size)
    : c(config),
      ep(expert_parallel_size),
      heads(transformer::gqa_heads(config.num_attention_heads, config.num_key_value_heads,
                                   config.head_dim, sequence_parallel_size)) {
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    (c.is_moe_layer(l) ? any_moe : any_dense) = true;
  }
}

std::int64_t MoeModel::moe_row_bytes(const MoeConfig& c, std::int64_t S) {
  const I64 C = c.hidden_size, E = c.num_experts, K = c.num_experts_per_tok;
  const I64 Ie = c.moe_intermediate_size, Is = c.shared_expert_intermediate_size;
  // Per token: the kept xe, y and gate, up, h, the backward's dy, dxe and dh, dgate, dup (k rows
  // each); the router's logits and their gradient, its fp32 probabilities; the shared expert's
  // gate, up, h and their three gradients (Is each), its output and its output's gradient (C).
  return K * (4 * C + 6 * Ie) * S + 2 * E * S + 4 * E + 6 * Is * S + 2 * C * S;
}

int MoeModel::moe_tile_rows(const MoeConfig& c, int setting, std::int64_t N, std::int64_t S) {
  return transformer::tile_rows(setting, N, moe_row_bytes(c, S), transformer::kMlpTileBudgetBytes);
}

int MoeModel::dense_tile_rows(const MoeConfig& c, int setting, std::int64_t N, std::int64_t S) {
  return transformer::swiglu_tile_rows(c.intermediate_size, setting, N, S);
}

void MoeModel::Activations::plan_moe_set(ActivationPlanner& p, MoeKept& m, std::int64_t rows,
                                         std::int64_t S) {
  const I64 C = c.hidden_size, E = c.num_experts, K = c.num_experts_per_tok;
  const I64 Ie = c.moe_intermediate_size, Is = c.shared_expert_intermediate_size;
  p.bytes(&m.logits, rows * E * S);
  p.floats(&m.probs, rows * E);
  p.floats(&m.weights, rows * K);
  p.bytes(&m.experts, rows * K * 4);
  if (c.capacity_factor > 0) p.bytes(&m.routed, rows * K * 4);
  p.bytes(&m.row_of, rows * K * 4);
  if (ep == 1) {
    p.bytes(&m.xe, rows * K * C * S);
    p.bytes(&m.gate, rows * K * Ie * S);
    p.bytes(&m.up, rows * K * Ie * S);
    p.bytes(&m.h, rows * K * Ie * S);
  }
  if (ep > 1) p.alias(&m.xe, &moe.xe);
  p.bytes(&m.y, rows * K * C * S);
  if (Is > 0) {
    p.bytes(&m.sgate, rows * Is * S);
    p.bytes(&m.sup, rows * Is * S);
    p.bytes(&m.sh, rows * Is * S);
    p.bytes(&m.sout, rows * C * S);
    p.bytes(&m.slogit, rows * S);
  }
}

void MoeModel::Activations::plan_forward(ActivationPlanner& p, const transformer::PassShape& s,
                                         const transformer::KeptSets& sets) {
  const I64 N = s.N(), S = s.S, C = c.hidden_size, I = c.intermediate_size;
  const I64 Q = I64{c.num_attention_heads} * c.head_dim;
  const I64 KV = I64{c.num_key_value_heads} * c.head_dim;
  const I64 K = c.num_experts_per_tok;
  moe_rows = moe_tile_rows(c, s.mlp_tile_setting, N, S);
  moe_tiled = any_moe && moe_rows < N;
  dense_rows = dense_tile_rows(c, s.mlp_tile_setting, N, S);
  dense_tiled = any_dense && dense_rows < N;
  const I64 Nm = moe_tiled ? moe_rows : N;
  kept.assign(static_cast<std::size_t>(sets.count), Kept());
  // Under expert parallelism the permuted rows only leave for the experts' ranks (the backward
  // reads the received copy, xl): one buffer every block's forward shares.
  if (any_moe && ep > 1) p.bytes(&moe.xe, Nm * K * C * S);
  for (Kept& a : kept) {
    p.bytes(&a.ln1, N * C * S);
    p.floats(&a.ln1_rstd, N);
    p.bytes(&a.q, N * Q * S);
    p.bytes(&a.k, N * heads.KV_full * S);
    p.bytes(&a.v, N * heads.KV_full * S);
    if (c.qk_norm()) {
      p.bytes(&a.q_pre, N * Q * S);
      p.bytes(&a.k_pre, N * KV * S);
      p.floats(&a.q_rstd, N * c.num_attention_heads);
      p.floats(&a.k_rstd, N * c.num_key_value_heads);
    }
    p.floats(&a.lse, I64{s.B} * c.num_attention_heads * s.T);
    p.bytes(&a.atty, N * Q * S);
    if (heads.sp > 1) p.bytes(&a.atty_full, N * Q * S);
    p.bytes(&a.res2, N * C * S);
    p.bytes(&a.ln2, N * C * S);
    p.floats(&a.ln2_rstd, N);
    if (any_dense && !dense_tiled) {
      p.bytes(&a.gate, N * I * S);
      p.bytes(&a.up, N * I * S);
      p.bytes(&a.h, N * I * S);
    }
    if (any_moe && !moe_tiled) plan_moe_set(p, a.moe, N, S);
  }
  // ExpertRows' kept sets: one per kept set that serves an MoE block, or the tile's.
  if (!moe_tiled) {
    const std::vector<bool> serves = serves_moe_layer(c, sets);
    int moe_sets = 0;
    for (std::size_t i = 0; i < kept.size(); ++i) {
      if (serves[i]) kept[i].moe.rows_set = moe_sets++;
    }
  }
  p.bytes(&proj, N * C * S);
  transformer::plan_gqa_exchange(p, heads, s, &send, &recv);
  if (dense_tiled) {
    p.bytes(&dense_tile.gate, dense_rows * I * S);
    p.bytes(&dense_tile.up, dense_rows * I * S);
    p.bytes(&dense_tile.h, dense_rows * I * S);
  }
  if (moe_tiled) {
    moe_tile = MoeKept();
    plan_moe_set(p, moe_tile, moe_rows, S);
  }
  if (any_moe) {
    const I64 E = c.num_experts;
    p.bytes(&moe.counts, E * 4);
    p.bytes(&moe.offsets, (E + 1) * 4);
    p.bytes(&moe.source, Nm * K * 4);
    if (c.capacity_factor > 0 && heads.sp > 1) p.bytes(&capacity_counts, heads.sp * s.B * E * 4);
  }
}

void MoeModel::Activations::plan_backward(ActivationPlanner& p, const transformer::PassShape& s) {
  const I64 N = s.N(), S = s.S, C = c.hidden_size, I = c.intermediate_size;
  const I64 Q = I64{c.num_attention_heads} * c.head_dim;
  const I64 E = c.num_experts, K = c.num_experts_per_tok, Ie = c.moe_intermediate_size;
  const I64 Is = c.shared_expert_intermediate_size;
  const I64 Nm = moe_tiled ? moe_rows : N, Nd = dense_tiled ? dense_rows : N;
  p.bytes(&dln1, N * C * S);
  p.bytes(&datty, N * Q * S);
  p.bytes(&dln2, N * C * S);
  if (any_dense) p.bytes(&dh, Nd * I * S);
  if (dense_tiled) {  // one tile's: the tiles zero them (swiglu_mlp_tiles.h)
    p.bytes(&dgate, Nd * I * S);
    p.bytes(&dup, Nd * I * S);
  }
  if (any_moe) {
    p.bytes(&moe.dy, Nm * K * C * S);
    if (ep == 1) p.bytes(&moe.dh, Nm * K * Ie * S);
    p.bytes(&moe.dxe, Nm * K * C * S);
    p.floats(&moe.dweights, Nm * K);
    p.bytes(&moe.dlogits, Nm * E * S);
    if (Is > 0) {
      p.bytes(&moe.ds, Nm * C * S);
      p.bytes(&moe.dsh, Nm * Is * S);
      p.bytes(&moe.dslogit, Nm * S);
    }
  }
  // One tile's: each tile zeroes them before its backward adds into them.
  if (moe_tiled) plan_moe_swiglu_gradients(p, Nm, S);
}

void MoeModel::Activations::plan_moe_swiglu_gradients(ActivationPlanner& p, std::int64_t rows,
                                                      std::int64_t S) {
  const I64 K = c.num_experts_per_tok, Ie = c.moe_intermediate_size;
  const I64 Is = c.shared_expert_intermediate_size;
  if (ep == 1) {  // under expert parallelism ExpertRows' (R, Ie) scratch
    p.bytes(&moe.dgate, rows * K * Ie * S);
    p.bytes(&moe.dup, rows * K * Ie * S);
  }
  if (Is > 0) {
    p.bytes(&moe.dsgate, rows * Is * S);
    p.bytes(&moe.dsup, rows * Is * S);
  }
}

void MoeModel::Activations::plan_accumulated(ActivationPlanner& p,
                                             const transformer::PassShape& s) {
  const I64 N = s.N(), S = s.S, I = c.intermediate_size;
  const I64 Q = I64{c.num_attention_heads} * c.head_dim;
  const I64 KV = I64{c.num_key_value_heads} * c.head_dim;
  p.bytes(&dq, N * Q * S);
  p.bytes(&dk, N * heads.KV_full * S);
  p.bytes(&dv, N * heads.KV_full * S);
  if (c.qk_norm()) {
    p.bytes(&dq_pre, N * Q * S);
    p.bytes(&dk_pre, N * KV * S);
  }
  if (any_dense && !dense_tiled) {
    p.bytes(&dgate, N * I * S);
    p.bytes(&dup, N * I * S);
  }
  if (any_moe && !moe_tiled) plan_moe_swiglu_gradients(p, N, S);
}

std::int64_t MoeModel::activation_bytes(const MoeConfig& config, int B, int T, DType dtype,
                                        bool activation_checkpointing, int expert_parallel_size,
                                        std::int64_t expert_rows, double expert_rows_reserve) {
  MoeOptions options;
  options.activation_checkpointing = activation_checkpointing;
  options.expert_rows_reserve = expert_rows_reserve;
  return activation_bytes(config, B, T, dtype, options, expert_parallel_size, expert_rows);
}

std::int64_t MoeModel::activation_bytes(const MoeConfig& config, int B, int T, DType dtype,
                                        const MoeOptions& options, int expert_parallel_size,
                                        std::int64_t expert_rows) {
  Activations scratch(config, expert_parallel_size, options.sequence_parallel_size());
  ExpertPartition experts{config.num_experts, expert_parallel_size, 0};
  I64 rows_bytes = 0;
  if (expert_parallel_size > 1) {
    experts.check();
    const ExpertRowsShape shape = expert_rows_shape(config, expert_parallel_size);
    // A tiled MoE layer's experts receive a tile's rows, into one kept set all layers share.
    const I64 N = I64{B} * T;
    const I64 Nm =
        moe_tile_rows(config, options.mlp_tile_rows, N, static_cast<I64>(dtype_size(dtype)));
    const bool tiled = Nm < N;
    const I64 rows = expert_rows > 0   ? expert_rows
                     : expert_rows < 0 ? shape.worst_rows(Nm)
                                       : shape.initial_rows(Nm, options.expert_rows_reserve);
    const std::vector<bool> serves = serves_moe_layer(
        config, transformer::kept_sets(config.num_hidden_layers, options.activation_checkpointing,
                                       options.planned_first_backward_block));
    const int sets = config.num_moe_layers() == 0 ? 0
                     : tiled                      ? 1
                             : static_cast<int>(std::count(serves.begin(), serves.end(), true));
    rows_bytes = shape.device_bytes(sets, rows, static_cast<I64>(dtype_size(dtype)));
  }
  return TransformerModel::activation_bytes(transformer_spec(config, experts), options, B, T, dtype,
                                            scratch) +
         kActivationAlign + router_bytes(config) + rows_bytes;
}

std::int64_t MoeModel::host_activation_bytes(const MoeConfig& config, int B, int T, DType dtype,
                                             const MoeOptions& options) {
  return TransformerModel::host_activation_bytes(
      transformer_spec(config, ExpertPartition{config.num_experts, 1, 0}), options, B, T, dtype);
}

std::int64_t MoeModel::local_expert_stride(ParamAccess& a, int first, bool grads,
                                           DType dtype) const {
  const int L = experts_.local();
  if (L == 1) return 0;  // one expert: no next one to reach
  auto at = [&](int i) { return grads ? a.grad(first + i) : a.param(first + i); };
  const Bytes base = at(0);
  const auto element = static_cast<I64>(dtype_size(dtype));
  const I64 numel = params_[static_cast<std::size_t>(first)].numel();
  // Device addresses are opaque (no difference on the host): the engine starts every parameter
  // at a power-of-two multiple of elements (partition.h's alignment), so the stride is numel
  // rounded up to one of them.
  I64 stride = 0;
  for (I64 align = 1; align <= (I64{1} << 20) && stride == 0; align *= 2) {
    const I64 candidate = (numel + align - 1) / align * align;
    if (base + candidate * element == at(1)) stride = candidate;
  }
  bool even = stride > 0;
  for (int i = 2; i < L && even; ++i) even = base + i * stride * element == at(i);
  if (!even) {
    ZRT_THROW(Error,
              "expert parallelism: the local experts' {} of {} are not evenly spaced in the "
              "engine's memory; the grouped GEMMs read them as one strided tensor",
              grads ? "gradients" : "parameters", params_[static_cast<std::size_t>(first)].name);
  }
  return stride;
}

MoeParams MoeModel::moe_params(ParamAccess& a, int layer, bool grads) const {
  // A frozen weight's gradient is null (trained_grad), so its GEMM is skipped: the router's and
  // the shared expert's linears, and the experts' grouped GEMMs (a fused expert tensor is frozen
  // as a whole: model.frozen matches the fused name, so all local experts of a kind together).
  auto linear = [&](int slot) {
    const int index = block_param(layer, slot);
    if (grads) return trained_grad(a, index);
    return index < 0 ? Bytes() : a.param(index);
  };
  MoeParams p;
  p.router = linear(kRouter);
  p.gate_up = linear(kGateUp);
  p.down = linear(kDown);
  if (experts_.ep_size > 1) {
    // One gradient pointer steps through the local experts of a kind: they are trained or
    // frozen together (model.frozen matches the fused name; a hand-set ParamSpec::frozen must
    // do the same). Checked where the gradients are taken.
    for (int slot : {kGateUp, kDown}) {
      if (!grads) break;
      const int first = block_param(layer, slot);
      for (int e = 1; e < experts_.local(); ++e) {
        ZRT_CHECK(a.trains(first + e) == a.trains(first),
                  "'{}' and '{}' are not both trained or both frozen: a layer's local experts of "
                  "one kind are frozen together",
                  params_[static_cast<std::size_t>(first)].name,
                  params_[static_cast<std::size_t>(first + e)].name);
      }
    }
    // Null gradients step with the parameters' stride (elements: the same layout).
    const auto stride = [&](int slot, Bytes at) {
      const bool of_grads = grads && static_cast<bool>(at);
      return local_expert_stride(a, block_param(layer, slot), of_grads,
                                 of_grads ? pass().grad_dtype : pass().dtype);
    };
    p.gate_up_stride = stride(kGateUp, p.gate_up);
    p.down_stride = stride(kDown, p.down);
  }
  p.shared_gate_proj = linear(kSharedGateProj);
  p.shared_up_proj = linear(kSharedUpProj);
  p.shared_down_proj = linear(kSharedDownProj);
  p.shared_expert_gate = linear(kSharedExpertGate);
  return p;
}

void MoeModel::block_forward(ParamAccess& a, int layer, Bytes res_in, Bytes res_out) {
  const Pass& pass = this->pass();
  Activations::Kept& x = acts_.kept[static_cast<std::size_t>(kept_set(layer))];
  const MoeConfig& c = config_;
  const int C = c.hidden_size, I = c.intermediate_size, hd = c.head_dim;
  const int NH = c.num_attention_heads, NKV = c.num_key_value_heads;
  const int Q = NH * hd, KV = NKV * hd;
  const int N = pass.N();
  const DType dt = pass.dtype;
  kernels::KernelContext& ctx = this->ctx();
  auto P = [&](int slot) {
    const int index = block_param(layer, slot);
    return index < 0 ? Bytes() : a.param(index);
  };
  // A new forward (not a recompute) starts the router statistics afresh at its first MoE layer.
  const bool counting = static_cast<bool>(res_out);
  if (counting && layer == first_moe_layer_) {
    ctx.device().fill_zero(router_.stats_counts.as<std::byte>(),
                           static_cast<std::size_t>(c.num_experts) * 4, ctx.stream());
    ctx.device().fill_zero(router_.stats_probsum.as<std::byte>(),
                           static_cast<std::size_t>(c.num_experts) * 4, ctx.stream());
    ctx.device().fill_zero(router_.z_sum.as<std::byte>(), 4, ctx.stream());
    std::fill(pass_tokens_.begin(), pass_tokens_.end(), 0);
    pass_dropped_ = 0;
  }
  k::rmsnorm_forward(ctx, dt, x.ln1, x.ln1_rstd, res_in, P(kLn1), N, C, c.rms_norm_eps);
  const Bytes q_out = c.qk_norm() ? x.q_pre : x.q;
  const Bytes k_out = c.qk_norm() ? x.k_pre : x.k;
  k::linear_forward(ctx, dt, q_out, x.ln1, P(kQW), P(kQB), N, C, Q);
  k::linear_forward(ctx, dt, k_out, x.ln1, P(kKW), P(kKB), N, C, KV);
  k::linear_forward(ctx, dt, x.v, x.ln1, P(kVW), P(kVB), N, C, KV);
  if (c.qk_norm()) {  // Qwen3: RMSNorm over each head's head_dim, before the rotation
    k::rmsnorm_forward(ctx, dt, x.q, x.q_rstd, x.q_pre, P(kQNorm), N * NH, hd, c.rms_norm_eps);
    k::rmsnorm_forward(ctx, dt, x.k, x.k_rstd, x.k_pre, P(kKNorm), N * NKV, hd, c.rms_norm_eps);
  }
  k::rope_forward(ctx, dt, x.q, x.q, rope_, pass.B, pass.T, NH, hd, pass.positions);
  k::rope_forward(ctx, dt, x.k, x.k, rope_, pass.B, pass.T, NKV, hd, pass.positions);
  gqa_attention_forward(acts_.heads, {x.q, x.k, x.v, x.atty, x.atty_full, x.lse}, acts_.send,
                        acts_.recv, c.sliding_window);
  k::linear_forward(ctx, dt, acts_.proj, x.atty, P(kOW), Bytes(), N, Q, C);
  k::residual_rmsnorm_forward(ctx, dt, x.res2, x.ln2, x.ln2_rstd, res_in, acts_.proj, P(kLn2), N, C,
                              c.rms_norm_eps);
  if (c.is_moe_layer(layer) && acts_.moe_tiled) {
    // The rerun under checkpointing leaves the layer to the backward, which runs each tile again.
    if (res_out) moe_tiled_forward(a, layer, x.ln2, counting);
  } else if (c.is_moe_layer(layer)) {
    x.moe.layer = layer;
    const MoeTile whole{N, 0, capacity_for(a, layer, x.ln2, x.moe, counting)};
    layer_.forward(ctx, dt, moe_params(a, layer, false), x.moe, acts_.moe, x.ln2, acts_.proj, N,
                   counting ? &router_ : nullptr, c.router_z_loss_coef > 0, &whole);
    if (counting) count_routing(layer, x.moe);
  } else if (acts_.dense_tiled) {
    if (res_out) {
      transformer::swiglu_mlp_tiled_forward(ctx, dt, dense_weights(a, layer, false), dense_tile(),
                                            x.ln2, acts_.proj, N, C, I);
    }
  } else {
    k::linear_forward(ctx, dt, x.gate, x.ln2, P(kDenseGate), Bytes(), N, C, I);
    k::linear_forward(ctx, dt, x.up, x.ln2, P(kDenseUp), Bytes(), N, C, I);
    k::swiglu_forward(ctx, dt, x.h, x.gate, x.up, I64{N} * I);
    if (res_out) k::linear_forward(ctx, dt, acts_.proj, x.h, P(kDenseDown), Bytes(), N, I, C);
  }
  if (res_out) k::residual_forward(ctx, dt, res_out, x.res2, acts_.proj, I64{N} * C);
}

int MoeModel::moe_index(int layer) const {
  int index = 0;
  for (int l = 0; l < layer; ++l) index += config_.is_moe_layer(l) ? 1 : 0;
  return index;
}

MoeCapacity* MoeModel::capacity_for(ParamAccess& a, int layer, Bytes ln2, MoeKept& kept,
                                    bool fresh) {
  const MoeConfig& c = config_;
  if (!(c.capacity_factor > 0)) return nullptr;
  capacity_.resize(static_cast<std::size_t>(c.num_moe_layers()));
  MoeCapacity& plan = capacity_[static_cast<std::size_t>(moe_index(layer))];
  if (!fresh) {
    ZRT_CHECK(!plan.taken.empty(), "MoE layer {} rerun before its forward planned its capacity",
              layer);
    plan.restart();
    return &plan;
  }
  const int sp = acts_.heads.sp;
  const int N = pass().N(), B = pass().B;
  const I64 E = c.num_experts;
  // Without sequence parallelism this rank's rows are the forward's, in order: one run.
  const I64 runs = sp > 1 ? B : 1;
  plan.forward_pairs = I64{N} * sp * c.num_experts_per_tok;
  plan.rows_per_run = N / runs;
  plan.ahead.assign(static_cast<std::size_t>(runs * E), 0);
  plan.taken.assign(plan.ahead.size(), 0);
  if (sp == 1) return &plan;
  // The pre-pass: this rank's choices per sequence and expert (the tiles' rows in turn)...
  std::vector<I64> mine(plan.ahead.size(), 0);
  const DType dt = pass().dtype;
  const MoeParams p = moe_params(a, layer, false);
  const int rows = acts_.moe_tiled ? acts_.moe_rows : N;
  const I64 row = I64{c.hidden_size} * static_cast<I64>(dtype_size(dt));
  for (int r0 = 0; r0 < N; r0 += rows) {
    layer_.count_choices(ctx(), dt, p, kept, ln2 + r0 * row, std::min(rows, N - r0), r0,
                         plan.rows_per_run, mine);
  }
  // ...then every rank's, each sequence's chunks in rank order after the earlier sequences'.
  transformer::UlyssesExchange* group = ulysses();
  ZRT_CHECK(group != nullptr, "sequence_parallel_size {} without its group", sp);
  const auto block = static_cast<std::size_t>(runs * E);
  std::vector<std::int32_t> all(static_cast<std::size_t>(sp) * block, 0);
  const std::size_t own = static_cast<std::size_t>(group->rank()) * block;
  for (std::size_t i = 0; i < block; ++i) all[own + i] = static_cast<std::int32_t>(mine[i]);
  kernels::KernelContext& ctx = this->ctx();
  DrainOnUnwind drain(ctx.stream());  // the copies read and write `all` on the stream
  ctx.device().copy_to_device(acts_.capacity_counts + static_cast<I64>(own) * 4, &all[own],
                              block * 4, ctx.stream());
  group->gather(acts_.capacity_counts, static_cast<I64>(block), DType::kInt32);
  ctx.device().copy_to_host(all.data(), acts_.capacity_counts, all.size() * 4, ctx.stream());
  ctx.stream().synchronize();
  std::vector<I64> earlier(static_cast<std::size_t>(E), 0);  // the earlier sequences' pairs
  for (I64 run = 0; run < runs; ++run) {
    for (I64 e = 0; e < E; ++e) {
      const auto at = static_cast<std::size_t>(run * E + e);
      I64 lower = 0, total = 0;
      for (int r = 0; r < sp; ++r) {
        const I64 count = all[static_cast<std::size_t>(r) * block + at];
        total += count;
        if (r < group->rank()) lower += count;
      }
      plan.ahead[at] = earlier[static_cast<std::size_t>(e)] + lower;
      earlier[static_cast<std::size_t>(e)] += total;
    }
  }
  return &plan;
}

void MoeModel::count_routing(int layer, const MoeKept& kept) {
  const MoeConfig& c = config_;
  // The dispatch plan's offsets are on the host already: count the pairs per expert.
  std::int64_t* tokens = &pass_tokens_[static_cast<std::size_t>(moe_index(layer)) * c.num_experts];
  for (int e = 0; e < c.num_experts; ++e) tokens[e] += kept.offsets[e + 1] - kept.offsets[e];
  pass_dropped_ += kept.dropped;
}

transformer::SwigluWeights MoeModel::dense_weights(ParamAccess& a, int layer, bool grads) const {
  auto get = [&](int slot) {
    const int index = block_param(layer, slot);
    return grads ? trained_grad(a, index) : a.param(index);
  };
  return {get(kDenseGate), get(kDenseUp), get(kDenseDown)};
}

transformer::SwigluTile MoeModel::dense_tile() const {
  const Activations& d = acts_;
  return {d.dense_rows, d.dense_tile.gate, d.dense_tile.up, d.dense_tile.h, d.dh, d.dgate, d.dup};
}

void MoeModel::moe_tiled_forward(ParamAccess& a, int layer, Bytes ln2, bool counting) {
  const MoeConfig& c = config_;
  const int N = pass().N();
  const DType dt = pass().dtype;
  const I64 row = I64{c.hidden_size} * static_cast<I64>(dtype_size(dt));
  const MoeParams p = moe_params(a, layer, false);
  MoeKept& m = acts_.moe_tile;
  m.layer = layer;
  MoeCapacity* capacity = capacity_for(a, layer, ln2, m, true);
  for (int r0 = 0; r0 < N; r0 += acts_.moe_rows) {
    const int n = std::min(acts_.moe_rows, N - r0);
    const MoeTile tile{N, r0, capacity};
    layer_.forward(ctx(), dt, p, m, acts_.moe, ln2 + r0 * row, acts_.proj + r0 * row, n,
                   counting ? &router_ : nullptr, c.router_z_loss_coef > 0, &tile);
    if (counting) count_routing(layer, m);
  }
}

void MoeModel::moe_tiled_backward(ParamAccess& a, int layer, Bytes ln2) {
  const MoeConfig& c = config_;
  const int N = pass().N();
  const DType dt = pass().dtype, gt = pass().grad_dtype;
  kernels::KernelContext& ctx = this->ctx();
  Activations& d = acts_;
  const I64 S = static_cast<I64>(dtype_size(dt));
  const I64 row = I64{c.hidden_size} * S;
  const MoeParams p = moe_params(a, layer, false), g = moe_params(a, layer, true);
  MoeKept& m = d.moe_tile;
  m.layer = layer;
  MoeCapacity* capacity = capacity_for(a, layer, ln2, m, false);
  const Bytes dres = this->dres();
  const I64 K = c.num_experts_per_tok, Ie = c.moe_intermediate_size;
  const I64 Is = c.shared_expert_intermediate_size;
  for (int r0 = 0; r0 < N; r0 += d.moe_rows) {
    const int n = std::min(d.moe_rows, N - r0);
    const Bytes x = ln2 + r0 * row;
    const MoeTile tile{N, r0, capacity};
    // The tile's routing and experts again (not counted: the forward did), then its backward,
    // whose SwiGLUs add into gradients no earlier tile may leave behind.
    layer_.forward(ctx, dt, p, m, d.moe, x, Bytes(), n, nullptr, false, &tile);
    if (experts_.ep_size == 1) {
      const auto bytes = static_cast<std::size_t>(n * K * Ie * S);
      ctx.device().fill_zero(d.moe.dgate, bytes, ctx.stream());
      ctx.device().fill_zero(d.moe.dup, bytes, ctx.stream());
    }
    if (Is > 0) {
      const auto bytes = static_cast<std::size_t>(n * Is * S);
      ctx.device().fill_zero(d.moe.dsgate, bytes, ctx.stream());
      ctx.device().fill_zero(d.moe.dsup, bytes, ctx.stream());
    }
    layer_.backward(ctx, dt, gt, p, g, m, d.moe, x, dres + r0 * row, d.dln2 + r0 * row, n, router_,
                    c.router_z_loss_coef > 0, &tile);
  }
}

void MoeModel::add_auxiliary_losses(Floats loss, float loss_scale) {
  const MoeConfig& c = config_;
  const int moe_layers = c.num_moe_layers();
  if (moe_layers == 0) return;
  kernels::KernelContext& ctx = this->ctx();
  // Under sequence parallelism a forward's tokens are spread over the sp group, a chunk each:
  // its statistics are the group's sums, and its rows sp chunks'. Every rank of the group adds
  // the forward's whole term to its loss (the logged loss is the ranks' mean, as for the
  // cross-entropy) and its tokens' share of the term's gradient times sp, since the engine
  // averages gradients over all ranks, the sp of each forward included.
  const int sp = acts_.heads.sp;
  if (sp > 1) {
    transformer::UlyssesExchange* group = ulysses();
    ZRT_CHECK(group != nullptr, "sequence_parallel_size {} without its group", sp);
    // counts and probsum are adjacent (the router buffer's layout), their padding zero.
    group->sum(router_.stats_counts, sequence_group_sum_floats(c));
    if (c.router_z_loss_coef > 0) group->sum(router_.z_sum, 1);
  }
  // transformers' load_balancing_loss_func over this forward's rows of every MoE layer.
  const I64 rows = I64{moe_layers} * pass().N() * sp;
  k::moe_load_balancing_loss(ctx, lb_, router_.stats_counts, router_.stats_probsum, c.num_experts,
                             rows);
  k::moe_add_loss_term(ctx, loss, lb_, static_cast<float>(c.router_aux_loss_coef));
  k::moe_load_balancing_loss_backward(
      ctx, router_.dprobs_shared, router_.stats_counts,
      static_cast<float>(c.router_aux_loss_coef) * loss_scale * static_cast<float>(sp),
      c.num_experts, rows);
  // z_sum: the sum over the group of each chunk's mean over its rows, so the forward's mean is
  // z_sum / sp; its gradient per row, sp x (1 / (sp x chunk rows)), is the chunk's own.
  if (c.router_z_loss_coef > 0) {
    k::moe_add_loss_term(ctx, loss, router_.z_sum,
                         static_cast<float>(c.router_z_loss_coef / static_cast<double>(sp)));
  }
  router_.z_grad = static_cast<float>(c.router_z_loss_coef) * loss_scale;
  // A training pass: its routing counts join the step's.
  for (std::size_t i = 0; i < pass_tokens_.size(); ++i) expert_tokens_[i] += pass_tokens_[i];
  dropped_ += pass_dropped_;
  ++passes_;
}

std::optional<ExpertLoad> MoeModel::take_expert_load() {
  ExpertLoad load{expert_tokens_, dropped_};
  if (rows_) {
    const ExpertRows::Peak peak = rows_->take_peak();
    load.rows_max = peak.rows;
    load.rows_balanced = peak.balanced;
    load.rows_capacity = rows_->capacity();
  }
  std::fill(expert_tokens_.begin(), expert_tokens_.end(), 0);
  dropped_ = 0;
  passes_ = 0;
  return load;
}

RoutingStats MoeModel::take_routing_stats() {
  RoutingStats s;
  s.passes = passes_;
  const ExpertLoad load = *take_expert_load();
  if (!load.tokens.empty()) {
    const auto [lo, hi] = std::minmax_element(load.tokens.begin(), load.tokens.end());
    s.min_tokens = *lo;
    s.max_tokens = *hi;
  }
  s.dropped = load.dropped;
  return s;
}

// On entry dres() holds the gradient of the block's output; on exit that of its input.
void MoeModel::block_backward(ParamAccess& a, int layer, Bytes res_in) {
  const Pass& pass = this->pass();
  const Activations::Kept& x = acts_.kept[static_cast<std::size_t>(kept_set(layer))];
  const MoeConfig& c = config_;
  const int C = c.hidden_size, I = c.intermediate_size, hd = c.head_dim;
  const int NH = c.num_attention_heads, NKV = c.num_key_value_heads;
  const int Q = NH * hd, KV = NKV * hd;
  const int N = pass.N();
  const DType dt = pass.dtype, gt = pass.grad_dtype;
  kernels::KernelContext& ctx = this->ctx();
  auto P = [&](int slot) {
    const int index = block_param(layer, slot);
    return index < 0 ? Bytes() : a.param(index);
  };
  // A parameter's gradient, null where the block has no such parameter or it is frozen: the
  // kernels then skip its work (a projection's GEMM, a norm's column sums), and a frozen
  // parameter needs no gradient buffer (Model::skips_frozen_gradients).
  auto G = [&](int slot) { return trained_grad(a, block_param(layer, slot)); };
  Activations& d = acts_;
  const Bytes dres = this->dres();
  const k::GradWrite first = k::GradWrite::kOverwrite;
  if (c.is_moe_layer(layer)) {
    const MoeParams p = moe_params(a, layer, false), g = moe_params(a, layer, true);
    // The grouped GEMMs step through a weight and its gradient with one stride.
    ZRT_CHECK(p.gate_up_stride == g.gate_up_stride && p.down_stride == g.down_stride,
              "expert parallelism: the experts' parameters and gradients are spaced differently "
              "({} / {} and {} / {} elements)",
              p.gate_up_stride, g.gate_up_stride, p.down_stride, g.down_stride);
    if (d.moe_tiled) {
      moe_tiled_backward(a, layer, x.ln2);
    } else {
      layer_.backward(ctx, dt, gt, p, g, x.moe, d.moe, x.ln2, dres, d.dln2, N, router_,
                      c.router_z_loss_coef > 0);
    }
  } else if (d.dense_tiled) {
    transformer::swiglu_mlp_tiled_backward(ctx, dt, gt, dense_weights(a, layer, false),
                                           dense_weights(a, layer, true), dense_tile(), x.ln2, dres,
                                           d.dln2, N, C, I);
  } else {
    k::linear_backward(ctx, dt, gt, d.dh, G(kDenseDown), Bytes(), dres, x.h, P(kDenseDown), N, I, C,
                       first);
    k::swiglu_backward(ctx, dt, d.dgate, d.dup, d.dh, x.gate, x.up, I64{N} * I);
    k::linear_backward(ctx, dt, gt, d.dln2, G(kDenseGate), Bytes(), d.dgate, x.ln2, P(kDenseGate),
                       N, C, I, first);
    k::linear_backward(ctx, dt, gt, d.dln2, G(kDenseUp), Bytes(), d.dup, x.ln2, P(kDenseUp), N, C,
                       I);
  }
  k::rmsnorm_backward(ctx, dt, gt, dres, G(kLn2), d.dln2, x.res2, P(kLn2), x.ln2_rstd, N, C);
  k::linear_backward(ctx, dt, gt, d.datty, G(kOW), Bytes(), dres, x.atty, P(kOW), N, Q, C, first);
  gqa_attention_backward(d.heads, {x.q, x.k, x.v, x.atty, x.atty_full, x.lse},
                         {d.dq, d.dk, d.dv, d.datty}, d.send, d.recv, c.sliding_window);
  k::rope_backward(ctx, dt, d.dq, d.dq, rope_, pass.B, pass.T, NH, hd, pass.positions);
  k::rope_backward(ctx, dt, d.dk, d.dk, rope_, pass.B, pass.T, NKV, hd, pass.positions);
  Bytes dq = d.dq, dk = d.dk;
  if (c.qk_norm()) {
    k::rmsnorm_backward(ctx, dt, gt, d.dq_pre, G(kQNorm), d.dq, x.q_pre, P(kQNorm), x.q_rstd,
                        N * NH, hd);
    k::rmsnorm_backward(ctx, dt, gt, d.dk_pre, G(kKNorm), d.dk, x.k_pre, P(kKNorm), x.k_rstd,
                        N * NKV, hd);
    dq = d.dq_pre;
    dk = d.dk_pre;
  }
  k::linear_backward(ctx, dt, gt, d.dln1, G(kQW), G(kQB), dq, x.ln1, P(kQW), N, C, Q, first);
  k::linear_backward(ctx, dt, gt, d.dln1, G(kKW), G(kKB), dk, x.ln1, P(kKW), N, C, KV);
  k::linear_backward(ctx, dt, gt, d.dln1, G(kVW), G(kVB), d.dv, x.ln1, P(kVW), N, C, KV);
  k::rmsnorm_backward(ctx, dt, gt, dres, G(kLn1), d.dln1, res_in, P(kLn1), x.ln1_rstd, N, C);
}

void MoeModel::blocks_backward_done() {
  if (rows_) rows_->settle();
}

}  // namespace zrt::moe
