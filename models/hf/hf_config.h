// A Hugging Face config.json read into the settings zrt's architectures need, with the keys'
// own names (a Llama's fields copy one to one into llama::LlamaConfig, a GPT-2's into
// gpt::GptConfig). Both forms of the rotary settings are read: transformers v4's top-level
// `rope_theta` + `rope_scaling` (`rope_type`, or the older `type`), and v5's `rope_parameters`
// (which carries `rope_theta` itself); when both give a value they must agree. A scaling zrt
// does not implement (dynamic, longrope, ...) is an error naming it, never ignored.
//
// Every problem is an InvalidArgument naming the file and the key: not JSON, a missing or
// mistyped key, an unknown model_type.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "models/rope_scaling.h"

namespace zrt::hf {

// rope_scaling / rope_parameters (models/rope_scaling.h). yarn without
// original_max_position_embeddings: max_position_embeddings, transformers' standardisation.
using HfRopeScaling = zrt::RopeScaling;

struct HfConfig {
  std::string path;                        // the file, for messages
  std::string model_type;                  // "gpt2", "llama", "qwen2", "mistral", "mixtral", ...
  std::vector<std::string> architectures;  // e.g. {"LlamaForCausalLM"}; may be empty
  std::string torch_dtype;                 // "float32", "bfloat16", "float16" or "" (v5: dtype)
  int vocab_size = 0;
  bool tie_word_embeddings = false;  // gpt2: true unless the file says otherwise
  std::optional<std::int64_t> bos_token_id, eos_token_id;

  // The Llama family (llama, qwen2, qwen3, mistral).
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;  // absent: num_attention_heads
  int head_dim = 0;             // absent or null: hidden_size / num_attention_heads
  int max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;  // transformers' default
  double rope_theta = 10000.0;
  HfRopeScaling rope_scaling;
  bool attention_bias = false;  // qwen2: always (its q/k/v projections carry biases)
  int sliding_window = 0;       // 0: none (mistral's null; qwen2/3 unless use_sliding_window)
  int max_window_layers = 0;    // qwen2, qwen3: the first layer with the window (0: every layer)
  std::string hidden_act;       // "silu" for the family

  // Mixture of experts (mixtral, qwen2_moe, qwen3_moe), config.json's names (Mixtral's
  // num_local_experts read into num_experts, its experts intermediate_size wide).
  int num_experts = 0;
  int num_experts_per_tok = 0;
  int moe_intermediate_size = 0;
  int shared_expert_intermediate_size = 0;
  bool norm_topk_prob = true;
  int decoder_sparse_step = 1;
  std::vector<int> mlp_only_layers;
  double router_aux_loss_coef = 0.001;

  // GPT-2.
  int n_layer = 0;
  int n_head = 0;
  int n_embd = 0;
  int n_positions = 0;
  double layer_norm_epsilon = 1e-5;
  std::string activation_function;  // zrt's GPT-2 computes "gelu_new" (tanh approximation)

  // The model types this reader understands.
  static const std::vector<std::string>& known_model_types();
  // Parses config.json's text; `path` names it in messages.
  static HfConfig parse(const std::string& text, const std::string& path);
  // Reads `path`: a config.json, or a directory holding one.
  static HfConfig read(const std::string& path);
};

// True if `path` is a directory holding a config.json (a Hugging Face model directory).
bool is_hf_model_dir(const std::string& path);
// config.json of an init_from path: the directory's own (required), or for a .safetensors or
// index file the config.json beside it when there is one.
std::optional<HfConfig> hf_config_for(const std::string& init_from);

}  // namespace zrt::hf
