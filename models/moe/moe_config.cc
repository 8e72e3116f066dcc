#include "models/moe/moe_config.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "kernels/moe_limits.h"
#include "kernels/rope_table.h"
#include "models/decoder_shape_keys.h"
#include "models/param_count_text.h"
#include "models/spec_values.h"
#include "runtime/common/error.h"

namespace zrt::moe {

namespace {

int parse_int_value(const std::string& key, const std::string& value) {
  return spec_int("moe", key, value);
}

double parse_double_value(const std::string& key, const std::string& value) {
  return spec_double("moe", key, value);
}

bool parse_bool_value(const std::string& key, const std::string& value) {
  return spec_bool("moe", key, value);
}

using I64 = std::int64_t;

constexpr int kPresetMaxSeqLen = 8192;

bool known_architecture(const std::string& a) {
  return a == "mixtral" || a == "qwen2_moe" || a == "qwen3_moe";
}

// The presets: shapes from each model's config.json on the Hugging Face Hub
// (mistralai/Mixtral-8x7B-v0.1, Qwen/Qwen1.5-MoE-A2.7B, Qwen/Qwen3-30B-A3B); the tiny ones are
// tests/golden/make_moe_golden.py's cases.
MoeConfig make_preset(const std::string& name) {
  MoeConfig c;
  c.name = name;
  if (name == "mixtral-8x7b") {
    c.architecture = "mixtral";
    c.hidden_size = 4096;
    c.intermediate_size = c.moe_intermediate_size = 14336;
    c.num_hidden_layers = 32;
    c.num_attention_heads = 32;
    c.num_key_value_heads = 8;
    c.head_dim = 128;
    c.vocab_size = 32000;
    c.max_position_embeddings = 32768;
    c.rms_norm_eps = 1e-5;
    c.rope_theta = 1e6;
    c.num_experts = 8;
    c.num_experts_per_tok = 2;
    c.router_aux_loss_coef = 0.02;
  } else if (name == "qwen2-moe-a2.7b") {
    c.architecture = "qwen2_moe";
    c.hidden_size = 2048;
    c.intermediate_size = 5632;
    c.moe_intermediate_size = 1408;
    c.shared_expert_intermediate_size = 5632;
    c.num_hidden_layers = 24;
    c.num_attention_heads = 16;
    c.num_key_value_heads = 16;
    c.head_dim = 128;
    c.vocab_size = 151936;
    c.max_position_embeddings = 8192;
    c.rms_norm_eps = 1e-6;
    c.rope_theta = 1e6;
    c.attention_bias = true;
    c.num_experts = 60;
    c.num_experts_per_tok = 4;
    c.norm_topk_prob = false;
    c.router_aux_loss_coef = 0.001;
  } else if (name == "qwen3-30b-a3b") {
    c.architecture = "qwen3_moe";
    c.hidden_size = 2048;
    c.intermediate_size = 6144;
    c.moe_intermediate_size = 768;
    c.num_hidden_layers = 48;
    c.num_attention_heads = 32;
    c.num_key_value_heads = 4;
    c.head_dim = 128;
    c.vocab_size = 151936;
    c.max_position_embeddings = 40960;
    c.rms_norm_eps = 1e-6;
    c.rope_theta = 1e6;
    c.num_experts = 128;
    c.num_experts_per_tok = 8;
    c.norm_topk_prob = true;
    c.router_aux_loss_coef = 0.001;
  } else if (name == "mixtral-tiny" || name == "qwen2-moe-tiny" || name == "qwen3-moe-tiny") {
    c.hidden_size = 16;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 8;
    c.vocab_size = 32;
    c.max_position_embeddings = 64;
    c.rms_norm_eps = 1e-5;
    c.rope_theta = 100.0;
    c.router_aux_loss_coef = 0.02;
    if (name == "mixtral-tiny") {
      c.architecture = "mixtral";
      c.intermediate_size = c.moe_intermediate_size = 12;
      c.num_experts = 4;
      c.num_experts_per_tok = 2;
    } else if (name == "qwen2-moe-tiny") {
      c.architecture = "qwen2_moe";
      c.intermediate_size = 20;
      c.moe_intermediate_size = 12;
      c.shared_expert_intermediate_size = 24;
      c.num_experts = 6;
      c.num_experts_per_tok = 2;
      c.norm_topk_prob = false;
      c.attention_bias = true;
      c.mlp_only_layers = {1};
    } else {
      c.architecture = "qwen3_moe";
      c.intermediate_size = 20;
      c.moe_intermediate_size = 8;
      c.num_experts = 8;
      c.num_experts_per_tok = 3;
    }
  } else {
    std::string names;
    for (const std::string& n : MoeConfig::preset_names()) names += (names.empty() ? "" : ", ") + n;
    ZRT_THROW(InvalidArgument, "unknown MoE preset '{}' (known: {})", name, names);
  }
  c.seq_len = std::min(c.max_position_embeddings, kPresetMaxSeqLen);
  return c;
}

// "1+3" (a spec's list: commas separate keys), "[1, 3]" (a saved config's JSON) or "" / "[]".
std::vector<int> parse_layers(const std::string& key, std::string value) {
  std::replace_if(
      value.begin(), value.end(), [](char ch) { return ch == '[' || ch == ']' || ch == ','; }, ' ');
  std::replace(value.begin(), value.end(), '+', ' ');
  std::istringstream in(value);
  std::vector<int> layers;
  std::string item;
  while (in >> item) layers.push_back(parse_int_value(key, item));
  return layers;
}

}  // namespace

bool MoeConfig::is_moe_layer(int layer) const {
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) {
    return false;
  }
  return num_experts > 0 && (layer + 1) % decoder_sparse_step == 0;
}

int MoeConfig::num_moe_layers() const {
  int n = 0;
  for (int l = 0; l < num_hidden_layers; ++l) n += is_moe_layer(l) ? 1 : 0;
  return n;
}

std::vector<std::string> MoeConfig::preset_names() {
  return {"mixtral-8x7b", "qwen2-moe-a2.7b", "qwen3-30b-a3b",
          "mixtral-tiny", "qwen2-moe-tiny",  "qwen3-moe-tiny"};
}

MoeConfig MoeConfig::preset(const std::string& name) {
  return make_preset(name);
}

MoeConfig MoeConfig::parse(const std::string& architecture, const std::string& spec) {
  MoeConfig c;
  c.architecture = architecture;
  std::string rest = spec;
  bool has_preset = false;
  const std::size_t colon = spec.find(':');
  const std::string head = spec.substr(0, colon);
  if (!head.empty() && head.find('=') == std::string::npos) {
    c = make_preset(head);
    if (c.architecture != architecture) {
      ZRT_THROW(InvalidArgument, "model.preset '{}' is a {} model, not model.type '{}'", head,
                c.architecture, architecture);
    }
    has_preset = true;
    rest = colon == std::string::npos ? "" : spec.substr(colon + 1);
  }
  DecoderShapeKeysGiven given;
  bool moe_width_given = false, norm_given = false;
  // A preset with keys changed is named after it (messages say which model it started from).
  const std::string modified = has_preset ? head + " (modified)" : std::string("custom");
  for (const auto& [key, value] : spec_items("moe", rest)) {
    c.name = modified;
    if (set_decoder_shape_key(c, "moe", key, value, given)) continue;
    if (key == "num_experts" || key == "num_local_experts") {
      c.num_experts = parse_int_value(key, value);
    } else if (key == "num_experts_per_tok") {
      c.num_experts_per_tok = parse_int_value(key, value);
    } else if (key == "moe_intermediate_size") {
      c.moe_intermediate_size = parse_int_value(key, value);
      moe_width_given = true;
    } else if (key == "shared_expert_intermediate_size") {
      c.shared_expert_intermediate_size = parse_int_value(key, value);
    } else if (key == "norm_topk_prob") {
      c.norm_topk_prob = parse_bool_value(key, value);
      norm_given = true;
    } else if (key == "decoder_sparse_step") {
      c.decoder_sparse_step = parse_int_value(key, value);
    } else if (key == "mlp_only_layers") {
      c.mlp_only_layers = parse_layers(key, value);
    } else if (key == "router_aux_loss_coef") {
      c.router_aux_loss_coef = parse_double_value(key, value);
    } else if (key == "router_z_loss_coef") {
      c.router_z_loss_coef = parse_double_value(key, value);
    } else if (key == "capacity_factor") {
      c.capacity_factor = parse_double_value(key, value);
    } else {
      ZRT_THROW(InvalidArgument,
                "moe config: unknown key '{}' (hidden_size, intermediate_size, "
                "num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim, "
                "vocab_size, max_position_embeddings, seq_len, rms_norm_eps, rope_theta, "
                "rope_scaling.{{rope_type, factor, original_max_position_embeddings, ...}}, "
                "tie_word_embeddings, attention_bias, sliding_window, num_experts "
                "(num_local_experts), num_experts_per_tok, moe_intermediate_size, "
                "shared_expert_intermediate_size, norm_topk_prob, decoder_sparse_step, "
                "mlp_only_layers, router_aux_loss_coef, router_z_loss_coef, capacity_factor)",
                key);
    }
  }
  if (!has_preset) {
    apply_decoder_shape_defaults(c, given, kPresetMaxSeqLen);
    if (architecture == "qwen2_moe") c.attention_bias = true;
    if (architecture == "mixtral" && !norm_given) c.norm_topk_prob = true;
  }
  // Mixtral's experts are intermediate_size wide (config.json has no moe_intermediate_size).
  if (architecture == "mixtral" && !moe_width_given) c.moe_intermediate_size = c.intermediate_size;
  require_yarn_original(c.rope_scaling, given.rope_original, architecture);
  c.validate();
  return c;
}

void MoeConfig::validate() const {
  if (!known_architecture(architecture)) {
    ZRT_THROW(InvalidArgument,
              "{}: model.type '{}' is not a mixture-of-experts architecture (mixtral, qwen2_moe, "
              "qwen3_moe)",
              name, architecture);
  }
  const std::pair<const char*, int> dims[] = {{"hidden_size", hidden_size},
                                              {"intermediate_size", intermediate_size},
                                              {"num_hidden_layers", num_hidden_layers},
                                              {"num_attention_heads", num_attention_heads},
                                              {"num_key_value_heads", num_key_value_heads},
                                              {"head_dim", head_dim},
                                              {"vocab_size", vocab_size},
                                              {"max_position_embeddings", max_position_embeddings},
                                              {"seq_len", seq_len},
                                              {"num_experts", num_experts},
                                              {"num_experts_per_tok", num_experts_per_tok},
                                              {"moe_intermediate_size", moe_intermediate_size},
                                              {"decoder_sparse_step", decoder_sparse_step}};
  for (const auto& [key, value] : dims) {
    if (value <= 0) {
      ZRT_THROW(InvalidArgument, "{} config {}: model.{}={} must be positive", architecture, name,
                key, value);
    }
  }
  if (num_experts_per_tok > num_experts || num_experts_per_tok > kernels::kMoeMaxTopK) {
    ZRT_THROW(InvalidArgument,
              "{} config {}: model.num_experts_per_tok={} must be at most num_experts={} (and at "
              "most {}, the router kernel's top-k)",
              architecture, name, num_experts_per_tok, num_experts, kernels::kMoeMaxTopK);
  }
  if (num_attention_heads % num_key_value_heads != 0) {
    ZRT_THROW(InvalidArgument,
              "{} config {}: model.num_key_value_heads={} does not divide num_attention_heads={}",
              architecture, name, num_key_value_heads, num_attention_heads);
  }
  if (head_dim % 2 != 0 || head_dim > 2 * kernels::kRopeMaxPairs) {
    ZRT_THROW(InvalidArgument, "{} config {}: model.head_dim={} must be even and at most {}",
              architecture, name, head_dim, 2 * kernels::kRopeMaxPairs);
  }
  if (seq_len > rope_scaling.position_limit(max_position_embeddings)) {
    ZRT_THROW(InvalidArgument, "{} config {}: {}", architecture, name,
              rope_scaling.position_limit_error(seq_len, max_position_embeddings));
  }
  if (!(rms_norm_eps > 0) || !(rope_theta > 0)) {
    ZRT_THROW(InvalidArgument,
              "{} config {}: model.rms_norm_eps={} and model.rope_theta={} must be positive",
              architecture, name, rms_norm_eps, rope_theta);
  }
  try {
    kernels::make_rope_table(head_dim, rope_theta, rope_scaling.params());
  } catch (const InvalidArgument& e) {
    ZRT_THROW(InvalidArgument, "{} config {}: model.rope_theta / model.rope_scaling: {}",
              architecture, name, e.what());
  }
  const std::pair<const char*, double> coefs[] = {{"router_aux_loss_coef", router_aux_loss_coef},
                                                  {"router_z_loss_coef", router_z_loss_coef},
                                                  {"capacity_factor", capacity_factor}};
  for (const auto& [key, value] : coefs) {
    if (!(value >= 0) || !std::isfinite(value)) {
      ZRT_THROW(InvalidArgument, "{} config {}: model.{}={} must be a finite number >= 0",
                architecture, name, key, value);
    }
  }
  if (shared_expert_intermediate_size < 0 ||
      (shared_expert_intermediate_size > 0 && architecture != "qwen2_moe")) {
    ZRT_THROW(InvalidArgument,
              "{} config {}: model.shared_expert_intermediate_size={}: only qwen2_moe has a "
              "shared expert",
              architecture, name, shared_expert_intermediate_size);
  }
  for (int l : mlp_only_layers) {
    if (l < 0 || l >= num_hidden_layers) {
      ZRT_THROW(InvalidArgument, "{} config {}: model.mlp_only_layers names layer {} of {}",
                architecture, name, l, num_hidden_layers);
    }
  }
  if (architecture == "mixtral") {
    if (!norm_topk_prob || !mlp_only_layers.empty() || decoder_sparse_step != 1 ||
        moe_intermediate_size != intermediate_size) {
      ZRT_THROW(InvalidArgument,
                "mixtral config {}: Mixtral renormalises its top-k weights and routes every "
                "layer through intermediate_size-wide experts (norm_topk_prob, mlp_only_layers, "
                "decoder_sparse_step, moe_intermediate_size are Qwen-MoE keys)",
                name);
    }
  }
  if (architecture == "qwen2_moe" && !attention_bias) {
    ZRT_THROW(InvalidArgument,
              "qwen2_moe config {}: model.attention_bias=false, but Qwen2-MoE always has q/k/v "
              "biases",
              name);
  }
  // As for the dense family: q/k/v biases are Qwen2's form; transformers' Mixtral and
  // Qwen3-MoE put one on o_proj too.
  if (architecture != "qwen2_moe" && attention_bias) {
    ZRT_THROW(InvalidArgument,
              "{} config {}: model.attention_bias=true is not supported: zrt's q/k/v biases are "
              "Qwen2's form (model.type qwen2_moe); transformers' {} has an o_proj bias as well",
              architecture, name, architecture);
  }
  if (sliding_window < 0) {
    ZRT_THROW(InvalidArgument,
              "{} config {}: model.sliding_window={} must be positive (or 0: none)", architecture,
              name, sliding_window);
  }
  // transformers' Qwen2-MoE windows every other layer below max_window_layers: a window on every
  // layer would export (and load) as another model.
  if (sliding_window > 0 && architecture == "qwen2_moe") {
    ZRT_THROW(InvalidArgument,
              "{} config {}: model.sliding_window={} is not supported for qwen2_moe: transformers "
              "windows every other layer below max_window_layers, which zrt does not implement",
              architecture, name, sliding_window);
  }
}

namespace {

struct Counts {
  I64 total = 0, active = 0;
};

Counts count_parameters(const MoeConfig& c) {
  const I64 C = c.hidden_size;
  const I64 Q = I64{c.num_attention_heads} * c.head_dim;
  const I64 KV = I64{c.num_key_value_heads} * c.head_dim;
  I64 attention = C * Q + 2 * C * KV + Q * C + (c.attention_bias ? Q + 2 * KV : 0);
  if (c.qk_norm()) attention += 2 * I64{c.head_dim};
  const I64 norms = 2 * C;
  const I64 dense_mlp = 3 * C * c.intermediate_size;
  const I64 expert = 3 * C * c.moe_intermediate_size;
  const I64 router = I64{c.num_experts} * C;
  const I64 shared = c.has_shared_expert() ? 3 * C * c.shared_expert_intermediate_size + C : 0;
  Counts n;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const I64 common = attention + norms;
    if (c.is_moe_layer(l)) {
      n.total += common + router + shared + I64{c.num_experts} * expert;
      n.active += common + router + shared + I64{c.num_experts_per_tok} * expert;
    } else {
      n.total += common + dense_mlp;
      n.active += common + dense_mlp;
    }
  }
  const I64 embed = I64{c.vocab_size} * C;
  const I64 rest = embed + C + (c.tie_word_embeddings ? 0 : embed);
  n.total += rest;
  n.active += rest;
  return n;
}

}  // namespace

std::int64_t MoeConfig::num_parameters() const {
  return count_parameters(*this).total;
}

std::int64_t MoeConfig::num_active_parameters() const {
  return count_parameters(*this).active;
}

std::string MoeConfig::describe() const {
  return fmt::format(
      "{} ({} L{} C{} E{}/k{} I{} H{}/{}x{} V{} T{}{}{}, {} params, {} "
      "active)",
      name, architecture, num_hidden_layers, hidden_size, num_experts, num_experts_per_tok,
      moe_intermediate_size, num_attention_heads, num_key_value_heads, head_dim, vocab_size,
      seq_len, rope_scaling.describe(), tie_word_embeddings ? " tied" : "",
      param_count_text(num_parameters()), param_count_text(num_active_parameters()));
}

}  // namespace zrt::moe
