#include "models/llama/llama_config.h"

#include <algorithm>
#include <cmath>

#include "kernels/rope_table.h"
#include "models/decoder_shape_keys.h"
#include "models/param_count_text.h"
#include "models/spec_values.h"
#include "runtime/common/error.h"

namespace zrt::llama {

namespace {

int parse_int_value(const std::string& key, const std::string& value) {
  return spec_int("llama", key, value);
}

constexpr int kPresetMaxSeqLen = 8192;

struct Preset {
  const char* name;
  const char* architecture;
  int hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
      head_dim, vocab_size, max_position_embeddings;
  double rms_norm_eps, rope_theta;
  double llama3_factor;  // 0: no rope scaling; else llama3 with (1, 4, 8192)
  bool tie_word_embeddings, attention_bias;
};

// From each model's config.json on the Hugging Face Hub (meta-llama/Llama-3.2-1B, ...).
constexpr Preset kPresets[] = {
    {"llama-tiny", "llama", 64, 128, 2, 4, 2, 16, 256, 256, 1e-5, 10000.0, 0, false, false},
    {"llama-3.2-1b", "llama", 2048, 8192, 16, 32, 8, 64, 128256, 131072, 1e-5, 500000.0, 32, true,
     false},
    {"llama-3.2-3b", "llama", 3072, 8192, 28, 24, 8, 128, 128256, 131072, 1e-5, 500000.0, 32, true,
     false},
    {"llama-3.1-8b", "llama", 4096, 14336, 32, 32, 8, 128, 128256, 131072, 1e-5, 500000.0, 8, false,
     false},
    {"llama-3.1-70b", "llama", 8192, 28672, 80, 64, 8, 128, 128256, 131072, 1e-5, 500000.0, 8,
     false, false},
    {"qwen2.5-0.5b", "qwen2", 896, 4864, 24, 14, 2, 64, 151936, 32768, 1e-6, 1000000.0, 0, true,
     true},
    {"qwen2.5-7b", "qwen2", 3584, 18944, 28, 28, 4, 128, 152064, 131072, 1e-6, 1000000.0, 0, false,
     true},
    // Qwen/Qwen3-0.6B and Qwen/Qwen3-8B: head_dim 128 whatever the width (wider than
    // hidden_size / num_attention_heads on the 0.6B), no attention biases, q_norm / k_norm.
    {"qwen3-0.6b", "qwen3", 1024, 3072, 28, 16, 8, 128, 151936, 40960, 1e-6, 1000000.0, 0, true,
     false},
    {"qwen3-8b", "qwen3", 4096, 12288, 36, 32, 8, 128, 151936, 40960, 1e-6, 1000000.0, 0, false,
     false},
    {"smollm2-135m", "llama", 576, 1536, 30, 9, 3, 64, 49152, 8192, 1e-5, 100000.0, 0, true, false},
};

std::string preset_list() {
  std::string names;
  for (const Preset& p : kPresets) names += std::string(names.empty() ? "" : ", ") + p.name;
  return names;
}

bool known_architecture(const std::string& a) {
  return a == "llama" || a == "qwen2" || a == "qwen3" || a == "mistral";
}

}  // namespace

std::vector<std::string> LlamaConfig::preset_names() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.emplace_back(p.name);
  return names;
}

LlamaConfig LlamaConfig::preset(const std::string& name) {
  for (const Preset& p : kPresets) {
    if (name != p.name) continue;
    LlamaConfig c;
    c.name = p.name;
    c.architecture = p.architecture;
    c.hidden_size = p.hidden_size;
    c.intermediate_size = p.intermediate_size;
    c.num_hidden_layers = p.num_hidden_layers;
    c.num_attention_heads = p.num_attention_heads;
    c.num_key_value_heads = p.num_key_value_heads;
    c.head_dim = p.head_dim;
    c.vocab_size = p.vocab_size;
    c.max_position_embeddings = p.max_position_embeddings;
    c.rms_norm_eps = p.rms_norm_eps;
    c.rope_theta = p.rope_theta;
    if (p.llama3_factor > 0) {
      c.rope_scaling.rope_type = "llama3";
      c.rope_scaling.factor = p.llama3_factor;
      c.rope_scaling.low_freq_factor = 1.0;
      c.rope_scaling.high_freq_factor = 4.0;
      c.rope_scaling.original_max_position_embeddings = 8192;
    }
    c.tie_word_embeddings = p.tie_word_embeddings;
    c.attention_bias = p.attention_bias;
    c.seq_len = std::min(p.max_position_embeddings, kPresetMaxSeqLen);
    return c;
  }
  ZRT_THROW(InvalidArgument, "unknown Llama-family preset '{}'; presets: {}", name, preset_list());
}

LlamaConfig LlamaConfig::parse(const std::string& architecture, const std::string& spec) {
  if (!known_architecture(architecture)) {
    ZRT_THROW(InvalidArgument, "llama config: architecture '{}' (llama, qwen2, qwen3, mistral)",
              architecture);
  }
  LlamaConfig c;
  c.architecture = architecture;
  c.attention_bias = architecture == "qwen2";
  std::string rest = spec;
  const auto colon = spec.find(':');
  const bool has_preset = spec.find('=') == std::string::npos || colon != std::string::npos;
  if (has_preset) {
    const std::string name = spec.substr(0, colon);
    c = preset(name);
    if (c.architecture != architecture) {
      ZRT_THROW(InvalidArgument, "model.preset {} is a {} model, but model.type is {}", name,
                c.architecture, architecture);
    }
    rest = colon == std::string::npos ? "" : spec.substr(colon + 1);
  }
  DecoderShapeKeysGiven given;
  // A preset with keys changed is named after it (messages say which model it started from).
  const std::string modified =
      has_preset ? spec.substr(0, colon) + " (modified)" : std::string("custom");
  for (const auto& [key, value] : spec_items("llama", rest)) {
    c.name = modified;
    if (set_decoder_shape_key(c, "llama", key, value, given)) continue;
    if (key == "max_window_layers") {
      c.max_window_layers = parse_int_value(key, value);
    } else {
      ZRT_THROW(InvalidArgument,
                "llama config: unknown key '{}' (hidden_size, intermediate_size, "
                "num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim, "
                "vocab_size, max_position_embeddings, seq_len, rms_norm_eps, rope_theta, "
                "rope_scaling.{{rope_type, factor, low_freq_factor, high_freq_factor, "
                "original_max_position_embeddings, attention_factor, beta_fast, beta_slow, "
                "mscale, mscale_all_dim, truncate}}, tie_word_embeddings, attention_bias, "
                "sliding_window, max_window_layers)",
                key);
    }
  }
  if (!has_preset) apply_decoder_shape_defaults(c, given, kPresetMaxSeqLen);
  require_yarn_original(c.rope_scaling, given.rope_original, architecture);
  c.validate();
  return c;
}

void LlamaConfig::validate() const {
  if (!known_architecture(architecture)) {
    ZRT_THROW(InvalidArgument,
              "{}: model.type '{}' is not a Llama-family architecture (llama, "
              "qwen2, qwen3, mistral)",
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
                                              {"seq_len", seq_len}};
  for (const auto& [key, value] : dims) {
    if (value <= 0) {
      ZRT_THROW(InvalidArgument, "{} config {}: model.{}={} must be positive", architecture, name,
                key, value);
    }
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
  if (!(rms_norm_eps > 0)) {
    ZRT_THROW(InvalidArgument, "{} config {}: model.rms_norm_eps={} must be positive", architecture,
              name, rms_norm_eps);
  }
  if (architecture == "qwen2" && !attention_bias) {
    ZRT_THROW(InvalidArgument,
              "qwen2 config {}: model.attention_bias=false, but Qwen2 always has q/k/v biases",
              name);
  }
  // zrt's biases are Qwen2's (q, k, v): transformers' Llama and Qwen3 put one on o_proj too,
  // and its Mistral none, so such a model would export to something else than what trained.
  if (architecture != "qwen2" && attention_bias) {
    ZRT_THROW(InvalidArgument,
              "{} config {}: model.attention_bias=true is not supported: zrt's q/k/v biases are "
              "Qwen2's form (model.type qwen2); transformers' {} has {}",
              architecture, name, architecture,
              architecture == "mistral" ? "no attention biases" : "an o_proj bias as well");
  }
  if (sliding_window < 0) {
    ZRT_THROW(InvalidArgument,
              "{} config {}: model.sliding_window={} must be positive (or 0: none)", architecture,
              name, sliding_window);
  }
  // transformers' Llama attends over the whole sequence: a window would export (and load) as
  // another model.
  if (sliding_window > 0 && architecture == "llama") {
    ZRT_THROW(InvalidArgument,
              "{} config {}: model.sliding_window={} is not a Llama setting (transformers' "
              "LlamaForCausalLM has no sliding window); model.type mistral, qwen2 or qwen3 has "
              "one",
              architecture, name, sliding_window);
  }
  if (max_window_layers < 0) {
    ZRT_THROW(InvalidArgument,
              "{} config {}: model.max_window_layers={} must be >= 0 (the first layer the window "
              "applies to)",
              architecture, name, max_window_layers);
  }
  if (max_window_layers > 0 && !windows_from_layer()) {
    ZRT_THROW(InvalidArgument,
              "{} config {}: model.max_window_layers={} is Qwen2's and Qwen3's (model.type qwen2, "
              "qwen3); {}'s sliding window applies to every layer",
              architecture, name, max_window_layers, architecture);
  }
  try {
    kernels::make_rope_table(head_dim, rope_theta, rope_scaling.params());
  } catch (const InvalidArgument& e) {
    ZRT_THROW(InvalidArgument, "{} config {}: model.rope_theta / model.rope_scaling: {}",
              architecture, name, e.what());
  }
}

std::int64_t LlamaConfig::num_parameters() const {
  using I64 = std::int64_t;
  const I64 C = hidden_size, I = intermediate_size;
  const I64 Q = I64{num_attention_heads} * head_dim, KV = I64{num_key_value_heads} * head_dim;
  const I64 attention = C * Q + 2 * C * KV + Q * C + (attention_bias ? Q + 2 * KV : 0) +
                        (qk_norm() ? 2 * I64{head_dim} : 0);
  const I64 block = 2 * C + attention + 3 * C * I;
  const I64 embed = I64{vocab_size} * C;
  return embed + I64{num_hidden_layers} * block + C + (tie_word_embeddings ? 0 : embed);
}

std::string LlamaConfig::describe() const {
  // A window that hides keys at this seq_len: " window 4096" (Qwen2: " window 4096 from layer 2").
  std::string window;
  if (sliding_window > 0 && sliding_window < seq_len && max_window_layers < num_hidden_layers) {
    window = fmt::format(" window {}", sliding_window);
    if (max_window_layers > 0) window += fmt::format(" from layer {}", max_window_layers);
  }
  const std::string rope = rope_scaling.describe();
  return fmt::format("{} ({} L{} C{} I{} H{}/{}x{} V{} T{}{}{}{}, {} params)", name, architecture,
                     num_hidden_layers, hidden_size, intermediate_size, num_attention_heads,
                     num_key_value_heads, head_dim, vocab_size, seq_len, window, rope,
                     tie_word_embeddings ? " tied" : "", param_count_text(num_parameters()));
}

}  // namespace zrt::llama
