// MoeConfig: the mixture-of-experts decoders of transformers (MixtralForCausalLM,
// Qwen2MoeForCausalLM, Qwen3MoeForCausalLM): a Llama-family block (RMSNorm, RoPE, grouped-query
// attention; q/k/v biases for Qwen2-MoE, per-head q/k RMSNorm for Qwen3-MoE) whose MLP is a
// routed mixture of SwiGLU experts (models/moe/moe_layer.h), with Qwen2-MoE's sigmoid-gated
// shared expert and Qwen2/3-MoE's dense layers (mlp_only_layers, decoder_sparse_step). Fields
// are named after config.json's keys (Mixtral's num_local_experts is num_experts here, its
// intermediate_size the experts' width, moe_intermediate_size).
//
// Parameter names are transformers v5's in-memory state dict (the fused per-layer experts):
//   model.layers.{i}.mlp.gate.weight              [num_experts, hidden_size]  (the router)
//   model.layers.{i}.mlp.experts.gate_up_proj     [num_experts, 2*moe_intermediate, hidden]
//   model.layers.{i}.mlp.experts.down_proj        [num_experts, hidden, moe_intermediate]
//   model.layers.{i}.mlp.shared_expert.{gate,up,down}_proj.weight, mlp.shared_expert_gate.weight
//                                                 (Qwen2-MoE)
//   model.layers.{i}.mlp.{gate,up,down}_proj.weight (a dense layer of Qwen2/3-MoE)
//   model.layers.{i}.self_attn.{q,k}_norm.weight  [head_dim] (Qwen3-MoE)
// and the Hub's per-expert form (block_sparse_moe.experts.N.w1/w2/w3, mlp.experts.N.*_proj) is
// read and written by models/moe/moe_hf.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/rope_scaling.h"

namespace zrt::moe {

struct MoeConfig {
  std::string architecture = "mixtral";  // "mixtral", "qwen2_moe", "qwen3_moe" (model_type)
  std::string name = "custom";           // the preset it came from, or "custom"

  int hidden_size = 0;
  int intermediate_size = 0;  // the dense MLP's width (Mixtral: the experts', = moe_intermediate)
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;
  int head_dim = 0;
  int vocab_size = 0;
  int max_position_embeddings = 0;
  double rms_norm_eps = 1e-5;
  double rope_theta = 1e6;
  RopeScaling rope_scaling;  // config.json's rope_scaling (yarn for Qwen3-MoE past 32K tokens)
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // Qwen2-MoE: always
  int sliding_window = 0;       // every layer's sliding window (kernels/ops.h); 0: none

  int num_experts = 0;                      // E (Mixtral's num_local_experts)
  int num_experts_per_tok = 0;              // k
  int moe_intermediate_size = 0;            // each expert's width
  int shared_expert_intermediate_size = 0;  // Qwen2-MoE's shared expert; 0: none
  bool norm_topk_prob = true;               // renormalise the top-k weights (Mixtral always)
  int decoder_sparse_step = 1;  // layer l is MoE iff (l+1) % step == 0 and l not mlp_only
  std::vector<int> mlp_only_layers;
  double router_aux_loss_coef = 0.001;  // the load-balancing term's weight in the loss
  double router_z_loss_coef = 0.0;      // ST-MoE's router z-loss weight; 0: none
  // Tokens an expert takes per forward: ceil(capacity_factor * N * k / E), the rest dropped (in
  // token order); 0: dropless (every token reaches its k experts, transformers' behaviour).
  double capacity_factor = 0.0;

  int seq_len = 0;  // zrt's training length, <= rope_scaling.position_limit(max_positions)

  bool qk_norm() const { return architecture == "qwen3_moe"; }
  bool has_shared_expert() const { return shared_expert_intermediate_size > 0; }
  // True iff block `layer` has the routed experts (else a dense SwiGLU MLP).
  bool is_moe_layer(int layer) const;
  int num_moe_layers() const;

  // mixtral-8x7b, qwen2-moe-a2.7b (Qwen1.5-MoE-A2.7B), qwen3-30b-a3b, and for tests
  // mixtral-tiny, qwen2-moe-tiny, qwen3-moe-tiny. Throws InvalidArgument naming the presets.
  static MoeConfig preset(const std::string& name);
  static std::vector<std::string> preset_names();
  // "mixtral-8x7b", "qwen3-moe-tiny:num_experts=4", or every dimension as key=value
  // (config.json's names; mlp_only_layers as 1+3; num_local_experts for num_experts). Validated.
  static MoeConfig parse(const std::string& architecture, const std::string& spec);

  // InvalidArgument naming the key unless every dimension is positive, 1 <= k <= E (and k <= the
  // kernels' limit), num_key_value_heads divides num_attention_heads, head_dim even, seq_len <=
  // max_position_embeddings (yarn: RopeScaling::position_limit), the rotary settings are valid,
  // the coefficients and capacity are >= 0, qwen2_moe has attention
  // biases, Mixtral renormalises and has no shared expert or dense layer.
  void validate() const;
  // Every parameter.
  std::int64_t num_parameters() const;
  // The parameters one token's forward reads: all but the routed experts it does not choose
  // (k of E per MoE layer), the embedding table counted as the published figures count it.
  std::int64_t num_active_parameters() const;
  // "qwen3-moe-tiny (qwen3_moe L2 C16 E8/k3 I8 ... , 0.1M params, 0.1M active)"
  std::string describe() const;
};

}  // namespace zrt::moe
