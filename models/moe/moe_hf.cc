#include "models/moe/moe_hf.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "models/moe/moe_model.h"
#include "models/rope_scaling_check.h"
#include "runtime/common/error.h"

namespace zrt::moe {

namespace {

using I64 = std::int64_t;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// "model.layers.{l}." of a block parameter's name, "" for any other.
std::string layer_prefix(const std::string& name) {
  const std::string head = "model.layers.";
  if (name.compare(0, head.size(), head) != 0) return "";
  const std::size_t dot = name.find('.', head.size());
  return dot == std::string::npos ? "" : name.substr(0, dot + 1);
}

// The Hub's name of expert e's projection `which` ("gate", "up", "down") in a layer.
std::string expert_tensor(const MoeConfig& c, const std::string& prefix, int e,
                          const std::string& which) {
  if (c.architecture == "mixtral") {
    const char* w = which == "gate" ? "w1" : which == "up" ? "w3" : "w2";
    return prefix + "block_sparse_moe.experts." + std::to_string(e) + "." + w + ".weight";
  }
  return prefix + "mlp.experts." + std::to_string(e) + "." + which + "_proj.weight";
}

// The number `digits` spells (a layer's or an expert's index), else -1.
int index_of(const std::string& digits) {
  if (digits.empty() || digits.size() > 6 ||
      digits.find_first_not_of("0123456789") != std::string::npos) {
    return -1;
  }
  return std::stoi(digits);
}

// e of "{prefix}mlp.experts.{e}.{kind}" (an expert's own parameter under expert parallelism),
// else -1.
int own_expert(const std::string& prefix, const std::string& name, const std::string& kind) {
  const std::string head = prefix + "mlp.experts.";
  const std::string tail = "." + kind;
  if (name.size() <= head.size() + tail.size() || name.compare(0, head.size(), head) != 0 ||
      !ends_with(name, tail)) {
    return -1;
  }
  return index_of(name.substr(head.size(), name.size() - head.size() - tail.size()));
}

std::vector<hf::HfPiece> expert_pieces(const MoeConfig& c, const std::string& name) {
  const std::string prefix = layer_prefix(name);
  const I64 C = c.hidden_size, I = c.moe_intermediate_size;
  std::vector<hf::HfPiece> pieces;
  if (prefix.empty()) return pieces;
  if (ends_with(name, "mlp.experts.gate_up_proj")) {
    for (int e = 0; e < c.num_experts; ++e) {
      pieces.push_back({expert_tensor(c, prefix, e, "gate"), {I, C}});
      pieces.push_back({expert_tensor(c, prefix, e, "up"), {I, C}});
    }
  } else if (ends_with(name, "mlp.experts.down_proj")) {
    for (int e = 0; e < c.num_experts; ++e) {
      pieces.push_back({expert_tensor(c, prefix, e, "down"), {C, I}});
    }
  } else if (const int e = own_expert(prefix, name, "gate_up_proj"); e >= 0) {
    // Expert parallelism's own parameter of expert e (moe_model.h): its two Hub tensors.
    pieces.push_back({expert_tensor(c, prefix, e, "gate"), {I, C}});
    pieces.push_back({expert_tensor(c, prefix, e, "up"), {I, C}});
  } else if (const int e = own_expert(prefix, name, "down_proj"); e >= 0) {
    pieces.push_back({expert_tensor(c, prefix, e, "down"), {C, I}});
  }
  return pieces;
}

}  // namespace

hf::HfImportRules import_rules(const MoeConfig& config) {
  hf::HfImportRules rules = hf::llama_family_rules();
  const MoeConfig c = config;
  rules.aliases = [c](const std::string& name) {
    std::vector<std::string> names;
    const std::string prefix = layer_prefix(name);
    if (c.architecture == "mixtral" && !prefix.empty() && ends_with(name, "mlp.gate.weight")) {
      names.push_back(prefix + "block_sparse_moe.gate.weight");
    }
    return names;
  };
  rules.pieces = [c](const std::string& name) { return expert_pieces(c, name); };
  // Under expert parallelism a rank builds only its own experts (each rank reads its own from
  // the file): the others' tensors are not a mismatch. Only a tensor of a real expert of an MoE
  // layer is passed over; an expert index past num_experts, or experts in a dense layer, still
  // match no parameter, and a rank's own expert missing from the file is still named.
  rules.ignorable = [c, base = rules.ignorable](const std::string& name) {
    if (base && base(name)) return true;
    const std::string prefix = layer_prefix(name);
    if (prefix.empty()) return false;
    const int layer = index_of(prefix.substr(13, prefix.size() - 14));  // "model.layers.{l}."
    if (layer < 0 || layer >= c.num_hidden_layers || !c.is_moe_layer(layer)) return false;
    const std::string head =
        prefix + (c.architecture == "mixtral" ? "block_sparse_moe.experts." : "mlp.experts.");
    if (name.compare(0, head.size(), head) != 0) return false;
    const std::size_t dot = name.find('.', head.size());
    if (dot == std::string::npos) return false;
    const int e = index_of(name.substr(head.size(), dot - head.size()));
    if (e < 0 || e >= c.num_experts) return false;
    for (const char* which : {"gate", "up", "down"}) {
      if (name == expert_tensor(c, prefix, e, which)) return true;
    }
    return false;
  };
  return rules;
}

namespace {

// The Hub's name of a parameter that is no expert's: Mixtral's router has its own.
std::string hub_name(const MoeConfig& config, const std::string& name) {
  const std::string prefix = layer_prefix(name);
  if (config.architecture == "mixtral" && !prefix.empty() && ends_with(name, "mlp.gate.weight")) {
    return prefix + "block_sparse_moe.gate.weight";
  }
  return name;
}

}  // namespace

std::vector<hf::HfPiece> hub_layout(const MoeConfig& config) {
  std::vector<hf::HfPiece> out;
  for (const ParamSpec& p : MoeModel::parameter_table(config)) {
    std::vector<hf::HfPiece> pieces = expert_pieces(config, p.name);
    if (pieces.empty()) pieces.push_back({hub_name(config, p.name), p.shape});
    for (hf::HfPiece& piece : pieces) out.push_back(std::move(piece));
  }
  return out;
}

std::vector<ExportTensor> hub_tensors(const MoeConfig& config, std::vector<ExportTensor> tensors) {
  std::vector<ExportTensor> out;
  for (ExportTensor& t : tensors) {
    const std::vector<hf::HfPiece> pieces = expert_pieces(config, t.name);
    if (pieces.empty()) {
      t.name = hub_name(config, t.name);
      out.push_back(std::move(t));
      continue;
    }
    I64 offset = 0;
    for (const hf::HfPiece& piece : pieces) {
      I64 numel = 1;
      for (I64 d : piece.shape) numel *= d;
      ZRT_CHECK(offset + numel <= static_cast<I64>(t.values.size()), "{}: {} values for {}", t.name,
                t.values.size(), piece.name);
      out.push_back(
          {piece.name, piece.shape,
           std::vector<float>(t.values.begin() + offset, t.values.begin() + offset + numel)});
      offset += numel;
    }
  }
  return out;
}

nlohmann::json hf_config_json(const MoeConfig& c) {
  nlohmann::json hf;
  const char* arch = c.architecture == "mixtral"     ? "MixtralForCausalLM"
                     : c.architecture == "qwen2_moe" ? "Qwen2MoeForCausalLM"
                                                     : "Qwen3MoeForCausalLM";
  hf["architectures"] = {arch};
  hf["model_type"] = c.architecture;
  hf["hidden_size"] = c.hidden_size;
  hf["intermediate_size"] = c.intermediate_size;
  hf["num_hidden_layers"] = c.num_hidden_layers;
  hf["num_attention_heads"] = c.num_attention_heads;
  hf["num_key_value_heads"] = c.num_key_value_heads;
  hf["head_dim"] = c.head_dim;
  hf["vocab_size"] = c.vocab_size;
  hf["max_position_embeddings"] = c.max_position_embeddings;
  hf["rms_norm_eps"] = c.rms_norm_eps;
  hf["rope_theta"] = c.rope_theta;
  hf["rope_scaling"] = c.rope_scaling.hf_json();
  hf["tie_word_embeddings"] = c.tie_word_embeddings;
  hf["sliding_window"] = c.sliding_window > 0 ? nlohmann::json(c.sliding_window) : nullptr;
  // Qwen3MoeConfig drops sliding_window unless use_sliding_window (then every layer's).
  // (transformers 4.51-4.57 window only the layers from max_window_layers on: 0, every one.)
  if (c.architecture == "qwen3_moe") {
    hf["use_sliding_window"] = c.sliding_window > 0;
    if (c.sliding_window > 0) hf["max_window_layers"] = 0;
  }
  hf["hidden_act"] = "silu";
  hf["num_experts_per_tok"] = c.num_experts_per_tok;
  hf["router_aux_loss_coef"] = c.router_aux_loss_coef;
  // transformers' default and the published configs': with it on, the model's labelled loss
  // would add the auxiliary term, which a loaded model's loss does not carry elsewhere (the
  // coefficient above is kept for a user who turns it on to train).
  hf["output_router_logits"] = false;
  if (c.architecture == "mixtral") {
    hf["num_local_experts"] = c.num_experts;
  } else {
    hf["num_experts"] = c.num_experts;
    hf["moe_intermediate_size"] = c.moe_intermediate_size;
    hf["norm_topk_prob"] = c.norm_topk_prob;
    hf["decoder_sparse_step"] = c.decoder_sparse_step;
    hf["mlp_only_layers"] = c.mlp_only_layers;
    if (c.architecture == "qwen2_moe") {
      hf["shared_expert_intermediate_size"] = c.shared_expert_intermediate_size;
      hf["qkv_bias"] = true;
    } else {
      hf["attention_bias"] = c.attention_bias;
    }
  }
  hf["torch_dtype"] = "float32";
  return hf;
}

MoeConfig config_from_hf(const hf::HfConfig& hf, const ModelConfig& run) {
  const std::string& path = hf.path;
  if (hf.model_type != run.type) {
    ZRT_THROW(InvalidArgument, "model.type '{}' contradicts {} model_type '{}'", run.type, path,
              hf.model_type);
  }
  MoeConfig c;
  c.architecture = hf.model_type;
  c.hidden_size = hf.hidden_size;
  c.intermediate_size = hf.intermediate_size;
  c.num_hidden_layers = hf.num_hidden_layers;
  c.num_attention_heads = hf.num_attention_heads;
  c.num_key_value_heads = hf.num_key_value_heads;
  c.head_dim = hf.head_dim;
  c.vocab_size = hf.vocab_size;
  c.max_position_embeddings = hf.max_position_embeddings;
  c.rms_norm_eps = hf.rms_norm_eps;
  c.rope_theta = hf.rope_theta;
  c.rope_scaling = hf.rope_scaling;
  c.tie_word_embeddings = hf.tie_word_embeddings;
  c.attention_bias = hf.attention_bias;
  c.sliding_window = hf.sliding_window;
  c.num_experts = hf.num_experts;
  c.num_experts_per_tok = hf.num_experts_per_tok;
  c.moe_intermediate_size = hf.moe_intermediate_size;
  c.shared_expert_intermediate_size = hf.shared_expert_intermediate_size;
  c.norm_topk_prob = hf.model_type == "mixtral" ? true : hf.norm_topk_prob;
  c.decoder_sparse_step = hf.decoder_sparse_step;
  c.mlp_only_layers = hf.mlp_only_layers;
  c.router_aux_loss_coef = run.router_aux_loss_coef.value_or(hf.router_aux_loss_coef);
  c.router_z_loss_coef = run.router_z_loss_coef.value_or(0.0);
  c.capacity_factor = run.capacity_factor.value_or(0.0);
  c.seq_len = run.seq_len ? *run.seq_len : std::min(c.max_position_embeddings, 8192);
  if (!run.preset.empty()) c.name = run.preset;
  auto check = [&](const char* key, auto file_value, const auto& run_value) {
    if (run_value && *run_value != file_value) {
      ZRT_THROW(InvalidArgument, "model.{} {} contradicts {} {} {}", key, *run_value, path, key,
                file_value);
    }
  };
  check("hidden_size", c.hidden_size, run.hidden_size);
  check("intermediate_size", c.intermediate_size, run.intermediate_size);
  check("num_hidden_layers", c.num_hidden_layers, run.num_hidden_layers);
  check("num_attention_heads", c.num_attention_heads, run.num_attention_heads);
  check("num_key_value_heads", c.num_key_value_heads, run.num_key_value_heads);
  check("head_dim", c.head_dim, run.head_dim);
  check("vocab_size", c.vocab_size, run.vocab_size);
  check("num_experts", c.num_experts, run.num_experts);
  check("num_experts_per_tok", c.num_experts_per_tok, run.num_experts_per_tok);
  check("moe_intermediate_size", c.moe_intermediate_size, run.moe_intermediate_size);
  check("tie_word_embeddings", c.tie_word_embeddings, run.tie_word_embeddings);
  // The keys that change no shape but the model's arithmetic: the file's values are the
  // model's, and a run value that says otherwise is refused, never silently dropped.
  check("max_position_embeddings", c.max_position_embeddings, run.max_position_embeddings);
  check("rms_norm_eps", c.rms_norm_eps, run.rms_norm_eps);
  check("rope_theta", c.rope_theta, run.rope_theta);
  check("norm_topk_prob", c.norm_topk_prob, run.norm_topk_prob);
  check("attention_bias", c.attention_bias, run.attention_bias);
  check("sliding_window", c.sliding_window, run.sliding_window);
  check("decoder_sparse_step", c.decoder_sparse_step, run.decoder_sparse_step);
  check("shared_expert_intermediate_size", c.shared_expert_intermediate_size,
        run.shared_expert_intermediate_size);
  if (run.mlp_only_layers && *run.mlp_only_layers != c.mlp_only_layers) {
    ZRT_THROW(InvalidArgument, "model.mlp_only_layers [{}] contradicts {} mlp_only_layers [{}]",
              fmt::join(*run.mlp_only_layers, ", "), path, fmt::join(c.mlp_only_layers, ", "));
  }
  check_run_rope_scaling(c.rope_scaling, run.rope_scaling, nullptr, "", path);
  c.validate();
  return c;
}

}  // namespace zrt::moe
