// LlamaConfig: the Llama family's architecture (Llama 2/3/3.1/3.2, Qwen2/2.5, Qwen3, Mistral), with
// the fields named after the keys of a Hugging Face config.json so that reading one is a
// one-to-one copy. The parameter names and layouts of the model built from it are exactly
// transformers' LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM state-dict names:
//   model.embed_tokens.weight                      [vocab_size, hidden_size]
//   model.layers.{i}.input_layernorm.weight        [hidden_size]
//   model.layers.{i}.self_attn.q_proj.weight       [num_attention_heads*head_dim, hidden_size]
//   model.layers.{i}.self_attn.k_proj.weight       [num_key_value_heads*head_dim, hidden_size]
//   model.layers.{i}.self_attn.v_proj.weight       [num_key_value_heads*head_dim, hidden_size]
//   model.layers.{i}.self_attn.{q,k,v}_proj.bias   (attention_bias only, e.g. Qwen2)
//   model.layers.{i}.self_attn.o_proj.weight       [hidden_size, num_attention_heads*head_dim]
//   model.layers.{i}.self_attn.{q,k}_norm.weight   [head_dim] (Qwen3 only: qk_norm())
//   model.layers.{i}.post_attention_layernorm.weight [hidden_size]
//   model.layers.{i}.mlp.gate_proj.weight          [intermediate_size, hidden_size]
//   model.layers.{i}.mlp.up_proj.weight            [intermediate_size, hidden_size]
//   model.layers.{i}.mlp.down_proj.weight          [hidden_size, intermediate_size]
//   model.norm.weight                              [hidden_size]
//   lm_head.weight                                 [vocab_size, hidden_size] (untied only)
// Weights are [out, in] row-major, as nn.Linear stores them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/rope_scaling.h"

namespace zrt::llama {

// config.json's "rope_scaling" (or transformers v5's "rope_parameters"): models/rope_scaling.h.
using RopeScaling = zrt::RopeScaling;

struct LlamaConfig {
  // "llama", "qwen2", "qwen3" or "mistral" (config.json model_type)
  std::string architecture = "llama";
  std::string name = "custom";  // the preset it came from, or "custom"

  int hidden_size = 0;          // C
  int intermediate_size = 0;    // the SwiGLU MLP's width
  int num_hidden_layers = 0;    // L
  int num_attention_heads = 0;  // NH
  int num_key_value_heads = 0;  // NKV, divides NH (grouped-query attention)
  int head_dim = 0;             // hs; config.json may omit it: hidden_size / num_attention_heads
  int vocab_size = 0;           // V
  int max_position_embeddings = 0;
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v projections carry biases (Qwen2)
  // Sliding-window attention (kernels/ops.h): query t sees keys > t - sliding_window; 0: none.
  // Mistral's applies to every layer; Qwen2's (use_sliding_window) to the layers from
  // max_window_layers on, the ones before attending over the whole sequence (transformers'
  // layer_types); Qwen3's the same. max_window_layers is 0 for Mistral.
  int sliding_window = 0;
  int max_window_layers = 0;

  // The sequence length the model trains at (zrt's, not config.json's); at most
  // rope_scaling.position_limit(max_position_embeddings).
  int seq_len = 0;

  // The presets (shapes from the models' config.json; weights come from the user's directory):
  // llama-3.2-1b, llama-3.2-3b, llama-3.1-8b, llama-3.1-70b, qwen2.5-0.5b, qwen2.5-7b,
  // qwen3-0.6b, qwen3-8b, smollm2-135m, and llama-tiny (2 layers, 64 wide, GQA 4/2, 256 byte-level
  // tokens, seq 256: for tests). A preset's seq_len is min(max_position_embeddings, 8192). Throws
  // InvalidArgument naming the presets for anything else.
  static LlamaConfig preset(const std::string& name);
  static std::vector<std::string> preset_names();
  // "llama-3.2-1b", "llama-tiny:seq_len=128,num_hidden_layers=4", or all dimensions as
  // key=value (config.json's names; rope_scaling's as rope_scaling.factor=8 etc.,
  // rope_scaling.rope_type=llama3). `architecture` is model.type ("llama", "qwen2", "qwen3",
  // "mistral"); a preset of another architecture is an error. Validated.
  static LlamaConfig parse(const std::string& architecture, const std::string& spec);

  // Throws InvalidArgument naming the key unless: every dimension is positive,
  // num_key_value_heads divides num_attention_heads, head_dim is even (<= 512), seq_len <=
  // max_position_embeddings (yarn: RopeScaling::position_limit), rms_norm_eps > 0, the rotary
  // settings are valid, qwen2 has attention_bias and no other architecture has, sliding_window and
  // max_window_layers are >= 0, and max_window_layers is 0 unless the architecture is qwen2 or
  // qwen3.
  void validate() const;
  // Qwen3's attention: an RMSNorm (weights [head_dim], the model's rms_norm_eps) over each query
  // and key head after its projection, before the rotation (transformers' q_norm / k_norm).
  bool qk_norm() const { return architecture == "qwen3"; }
  // Whether the architecture windows the layers from max_window_layers on (Qwen2's and Qwen3's
  // use_sliding_window) rather than every layer (Mistral).
  bool windows_from_layer() const { return architecture == "qwen2" || architecture == "qwen3"; }
  // The sliding window of layer `layer` (0: none): sliding_window from max_window_layers on.
  int layer_window(int layer) const {
    return sliding_window > 0 && layer >= max_window_layers ? sliding_window : 0;
  }
  std::int64_t num_parameters() const;
  // "llama-3.2-1b (llama L16 C2048 I8192 H32/8x64 V128256 T8192, 1235.8M params)"
  std::string describe() const;
};

}  // namespace zrt::llama
