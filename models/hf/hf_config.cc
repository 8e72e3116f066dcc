#include "models/hf/hf_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "kernels/rope_table.h"
#include "runtime/common/error.h"

namespace zrt::hf {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Typed reads of one config.json object, every problem naming the file and the key.
class Reader {
 public:
  Reader(const json& doc, std::string path, std::string prefix = "")
      : doc_(doc), path_(std::move(path)), prefix_(std::move(prefix)) {}

  bool has(const char* key) const { return doc_.contains(key) && !doc_[key].is_null(); }

  int get_int(const char* key) const {
    if (!has(key)) ZRT_THROW(InvalidArgument, "{}: {}{} is missing", path_, prefix_, key);
    return opt_int(key, 0);
  }
  int opt_int(const char* key, int fallback) const {
    if (!has(key)) return fallback;
    const json& v = doc_[key];
    if (!v.is_number_integer() || v.get<std::int64_t>() < 0 || v.get<std::int64_t>() > 2147483647) {
      ZRT_THROW(InvalidArgument, "{}: {}{} is {}, not a non-negative integer", path_, prefix_, key,
                v.dump());
    }
    return v.get<int>();
  }
  double opt_double(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    const json& v = doc_[key];
    if (!v.is_number() || !std::isfinite(v.get<double>())) {
      ZRT_THROW(InvalidArgument, "{}: {}{} is {}, not a number", path_, prefix_, key, v.dump());
    }
    return v.get<double>();
  }
  bool opt_bool(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!doc_[key].is_boolean()) {
      ZRT_THROW(InvalidArgument, "{}: {}{} is {}, not true or false", path_, prefix_, key,
                doc_[key].dump());
    }
    return doc_[key].get<bool>();
  }
  std::string opt_string(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    if (!doc_[key].is_string()) {
      ZRT_THROW(InvalidArgument, "{}: {}{} is {}, not a string", path_, prefix_, key,
                doc_[key].dump());
    }
    return doc_[key].get<std::string>();
  }
  // A token id: an integer, or a list of them (the first is taken: eos lists of Llama 3.1).
  std::optional<std::int64_t> opt_token(const char* key) const {
    if (!has(key)) return std::nullopt;
    const json& v = doc_[key];
    if (v.is_number_integer()) return v.get<std::int64_t>();
    if (v.is_array() && !v.empty() && v[0].is_number_integer()) return v[0].get<std::int64_t>();
    ZRT_THROW(InvalidArgument, "{}: {}{} is {}, not a token id", path_, prefix_, key, v.dump());
  }

 private:
  const json& doc_;
  std::string path_;
  std::string prefix_;
};

const std::vector<std::string> kLlamaFamily = {"llama",   "qwen2",     "qwen3",    "mistral",
                                               "mixtral", "qwen2_moe", "qwen3_moe"};

// rope_scaling (v4) or rope_parameters (v5): the scaling, and the theta v5 keeps inside.
void read_rope(const json& doc, const std::string& path, HfConfig& c) {
  const Reader top(doc, path);
  c.rope_theta = top.opt_double("rope_theta", c.rope_theta);
  for (const char* block : {"rope_scaling", "rope_parameters"}) {
    if (!doc.contains(block) || doc[block].is_null()) continue;
    const json& r = doc[block];
    if (!r.is_object()) {
      ZRT_THROW(InvalidArgument, "{}: {} is {}, not an object", path, block, r.dump());
    }
    const Reader rr(r, path, std::string(block) + ".");
    // v4 wrote "type" before "rope_type"; v5 always "rope_type".
    std::string type = rr.opt_string("rope_type", rr.opt_string("type", "default"));
    if (type != "default" && type != "llama3" && type != "yarn" && type != "linear") {
      ZRT_THROW(InvalidArgument,
                "{}: {}.rope_type '{}' is not supported (zrt implements 'default', 'linear', "
                "'llama3' and 'yarn')",
                path, block, type);
    }
    if (rr.has("rope_theta")) {
      const double theta = rr.opt_double("rope_theta", 0);
      if (top.has("rope_theta") && theta != c.rope_theta) {
        ZRT_THROW(InvalidArgument, "{}: rope_theta {} and {}.rope_theta {} disagree", path,
                  c.rope_theta, block, theta);
      }
      c.rope_theta = theta;
    }
    HfRopeScaling s;
    s.rope_type = type;
    if (type == "llama3") {
      const char* needed[] = {"factor", "low_freq_factor", "high_freq_factor",
                              "original_max_position_embeddings"};
      for (const char* key : needed) {
        if (!rr.has(key)) {
          ZRT_THROW(InvalidArgument, "{}: {}.{} is missing (rope_type llama3 needs it)", path,
                    block, key);
        }
      }
      s.factor = rr.opt_double("factor", s.factor);
      s.low_freq_factor = rr.opt_double("low_freq_factor", s.low_freq_factor);
      s.high_freq_factor = rr.opt_double("high_freq_factor", s.high_freq_factor);
      s.original_max_position_embeddings = rr.opt_int("original_max_position_embeddings", 0);
      if (s.factor < 1 || s.low_freq_factor <= 0 || s.high_freq_factor <= s.low_freq_factor ||
          s.original_max_position_embeddings <= 0) {
        ZRT_THROW(InvalidArgument,
                  "{}: {}: llama3 scaling needs factor >= 1, 0 < low_freq_factor < "
                  "high_freq_factor and original_max_position_embeddings > 0 (got {})",
                  path, block, r.dump());
      }
    }
    if (type == "linear") {
      if (!rr.has("factor")) {
        ZRT_THROW(InvalidArgument, "{}: {}.factor is missing (rope_type linear needs it)", path,
                  block);
      }
      s.factor = rr.opt_double("factor", s.factor);
    }
    if (type == "yarn") {
      // transformers' standardisation and _compute_yarn_parameters: the original context
      // defaults to max_position_embeddings, a missing factor to max_position_embeddings over it.
      s.original_max_position_embeddings =
          rr.opt_int("original_max_position_embeddings", c.max_position_embeddings);
      if (s.original_max_position_embeddings <= 0) {
        ZRT_THROW(InvalidArgument, "{}: {}.original_max_position_embeddings must be positive", path,
                  block);
      }
      s.factor = rr.opt_double("factor", static_cast<double>(c.max_position_embeddings) /
                                             s.original_max_position_embeddings);
      s.attention_factor = rr.opt_double("attention_factor", 0);
      s.beta_fast = rr.opt_double("beta_fast", 0);
      s.beta_slow = rr.opt_double("beta_slow", 0);
      s.mscale = rr.opt_double("mscale", 0);
      s.mscale_all_dim = rr.opt_double("mscale_all_dim", 0);
      s.truncate = rr.opt_bool("truncate", true);
      if (s.factor < 1 || s.attention_factor < 0 || s.beta_fast < 0 || s.beta_slow < 0 ||
          s.mscale < 0 || s.mscale_all_dim < 0 ||
          (s.beta_fast > 0 ? s.beta_fast : kernels::kYarnBetaFast) <
              (s.beta_slow > 0 ? s.beta_slow : kernels::kYarnBetaSlow)) {
        ZRT_THROW(InvalidArgument,
                  "{}: {}: yarn scaling needs factor >= 1, beta_fast >= beta_slow and "
                  "attention_factor, beta_fast, beta_slow, mscale, mscale_all_dim >= 0 (got {})",
                  path, block, r.dump());
      }
    }
    c.rope_scaling = s;
  }
  if (!(c.rope_theta > 0)) ZRT_THROW(InvalidArgument, "{}: rope_theta must be > 0", path);
}

// The experts of Mixtral (num_local_experts, intermediate_size wide, always renormalised) and
// Qwen2/3-MoE (num_experts of moe_intermediate_size, norm_topk_prob, the dense layers).
void read_moe(const json& doc, const std::string& path, HfConfig& c) {
  const Reader r(doc, path);
  c.num_experts_per_tok = r.get_int("num_experts_per_tok");
  c.router_aux_loss_coef = r.opt_double("router_aux_loss_coef", c.router_aux_loss_coef);
  if (c.model_type == "mixtral") {
    c.num_experts = r.get_int("num_local_experts");
    c.moe_intermediate_size = c.intermediate_size;
    return;
  }
  // transformers v5 writes Qwen3-MoE's count as num_local_experts (its attribute map's name).
  c.num_experts = r.has("num_experts") ? r.get_int("num_experts") : r.get_int("num_local_experts");
  c.moe_intermediate_size = r.get_int("moe_intermediate_size");
  c.norm_topk_prob = r.opt_bool("norm_topk_prob", c.model_type == "qwen3_moe");
  c.decoder_sparse_step = r.opt_int("decoder_sparse_step", 1);
  if (c.model_type == "qwen2_moe") {
    c.shared_expert_intermediate_size = r.opt_int("shared_expert_intermediate_size", 0);
  }
  if (r.has("mlp_only_layers") && !doc["mlp_only_layers"].is_null()) {
    const json& layers = doc["mlp_only_layers"];
    if (!layers.is_array()) ZRT_THROW(InvalidArgument, "{}: mlp_only_layers is not a list", path);
    for (const json& l : layers) {
      if (!l.is_number_integer()) {
        ZRT_THROW(InvalidArgument, "{}: mlp_only_layers holds {}", path, l.dump());
      }
      c.mlp_only_layers.push_back(l.get<int>());
    }
  }
}

// The sliding_window of a config.json whose use_sliding_window is set: the key's value (null:
// none), or, where the key is absent, the configuration class's default, 4096 (Qwen2Config,
// Qwen2MoeConfig, Qwen3MoeConfig and MistralConfig alike).
int window_or_default(const json& doc, const std::string& path) {
  return doc.contains("sliding_window") ? Reader(doc, path).opt_int("sliding_window", 0) : 4096;
}

// Qwen2's, Qwen3's and Qwen2-MoE's sliding window (transformers' layer_types): none unless
// use_sliding_window and a sliding_window. Qwen2 and Qwen3 window the layers from
// max_window_layers on (or those config.json's own layer_types marks sliding_attention, which
// must then be such a suffix); Qwen2-MoE every other layer below max_window_layers, which zrt does
// not implement: refused.
void read_qwen2_window(const json& doc, const std::string& path, HfConfig& c) {
  const Reader r(doc, path);
  if (!r.opt_bool("use_sliding_window", false)) {
    // transformers then has no window to give the layers layer_types marks sliding (it fails
    // building their mask): refused rather than trained as full attention.
    if (r.has("layer_types") && doc["layer_types"].is_array()) {
      for (const json& type : doc["layer_types"]) {
        if (type == "sliding_attention") {
          ZRT_THROW(InvalidArgument,
                    "{}: layer_types marks sliding_attention layers, but use_sliding_window is "
                    "false (no window for them): set use_sliding_window true with a "
                    "sliding_window, or mark every layer full_attention",
                    path);
        }
      }
    }
    return;
  }
  const int window = window_or_default(doc, path);
  if (window <= 0) return;
  const int L = c.num_hidden_layers;
  int first = std::max(r.opt_int("max_window_layers", 28), 0);
  if (c.model_type == "qwen2_moe") {
    bool typed_sliding = false;
    if (r.has("layer_types") && doc["layer_types"].is_array()) {
      for (const json& type : doc["layer_types"]) typed_sliding |= type == "sliding_attention";
    }
    if (first > 0 || typed_sliding) {
      ZRT_THROW(InvalidArgument,
                "{}: use_sliding_window with max_window_layers {}{}: Qwen2-MoE then windows "
                "every other layer below it, which zrt does not implement (set "
                "use_sliding_window false, or max_window_layers 0 for no windowed layer)",
                path, first, typed_sliding ? " (layer_types has sliding_attention)" : "");
    }
    return;
  }
  if (r.has("layer_types")) {
    const json& types = doc["layer_types"];
    if (!types.is_array() || static_cast<int>(types.size()) != L) {
      ZRT_THROW(InvalidArgument, "{}: layer_types must list the {} layers' attention types", path,
                L);
    }
    first = L;
    for (int i = 0; i < L; ++i) {
      const std::string type = types[i].is_string() ? types[i].get<std::string>() : "";
      if (type != "full_attention" && type != "sliding_attention") {
        ZRT_THROW(InvalidArgument,
                  "{}: layer_types[{}] is {}: expected full_attention or sliding_attention", path,
                  i, types[i].dump());
      }
      if (type == "sliding_attention" && first == L) first = i;
      if (type == "full_attention" && first < L) {
        ZRT_THROW(InvalidArgument,
                  "{}: layer_types has full_attention at layer {} after sliding_attention at "
                  "layer {}: zrt windows the layers from one on (Qwen2's max_window_layers)",
                  path, i, first);
      }
    }
  }
  if (first >= L) return;  // no layer windowed
  c.sliding_window = window;
  c.max_window_layers = first;
}

void read_llama_family(const json& doc, const std::string& path, HfConfig& c) {
  const Reader r(doc, path);
  c.hidden_size = r.get_int("hidden_size");
  c.intermediate_size = r.get_int("intermediate_size");
  c.num_hidden_layers = r.get_int("num_hidden_layers");
  c.num_attention_heads = r.get_int("num_attention_heads");
  c.vocab_size = r.get_int("vocab_size");
  c.max_position_embeddings = r.get_int("max_position_embeddings");
  c.num_key_value_heads = r.opt_int("num_key_value_heads", c.num_attention_heads);
  if (c.num_attention_heads == 0) {
    ZRT_THROW(InvalidArgument, "{}: num_attention_heads must be positive", path);
  }
  // Qwen3Config's head_dim is a field defaulting to 128 (Qwen3-0.6B's is wider than hidden_size /
  // num_attention_heads); the others derive it (their modeling code's getattr fallback).
  c.head_dim =
      r.opt_int("head_dim", c.model_type == "qwen3" ? 128 : c.hidden_size / c.num_attention_heads);
  // transformers' defaults where a key is absent differ by family (MixtralConfig's eps 1e-5 and
  // theta 1e6).
  const bool mixtral = c.model_type == "mixtral";
  c.rms_norm_eps = r.opt_double("rms_norm_eps", mixtral ? 1e-5 : c.rms_norm_eps);
  if (mixtral) c.rope_theta = 1e6;
  c.tie_word_embeddings = r.opt_bool("tie_word_embeddings", false);
  // The family's MLP is SwiGLU: SiLU (transformers' "swish" is the same function). Another
  // activation is a different model, refused rather than trained as SiLU.
  c.hidden_act = r.opt_string("hidden_act", "silu");
  if (c.hidden_act != "silu" && c.hidden_act != "swish") {
    ZRT_THROW(InvalidArgument,
              "{}: hidden_act '{}' is not supported: zrt's {} MLP is SwiGLU (silu)", path,
              c.hidden_act, c.model_type);
  }
  if (r.opt_bool("mlp_bias", false)) {
    ZRT_THROW(InvalidArgument,
              "{}: mlp_bias true is not supported: zrt's {} MLP projections carry no biases", path,
              c.model_type);
  }
  read_rope(doc, path, c);
  if (mixtral || c.model_type == "qwen2_moe" || c.model_type == "qwen3_moe") {
    read_moe(doc, path, c);
  }
  if (c.model_type == "qwen2" || c.model_type == "qwen2_moe") {
    c.attention_bias = true;  // Qwen2's q/k/v projections always carry biases
    read_qwen2_window(doc, path, c);
  } else if (c.model_type == "qwen3") {
    // Qwen3's attention_bias, like Llama's, puts biases on o_proj as well (refused below for
    // Llama); its windows are Qwen2's.
    if (r.opt_bool("attention_bias", false)) {
      ZRT_THROW(InvalidArgument,
                "{}: attention_bias true is not supported for qwen3: transformers then puts "
                "biases on q, k, v and o_proj; zrt's attention takes q/k/v biases only (Qwen2's)",
                path);
    }
    read_qwen2_window(doc, path, c);
  } else if (c.model_type == "mistral") {
    // MistralForCausalLM's projections never take biases (an attention_bias key is ignored by
    // transformers too); a window absent from the file is MistralConfig's default, 4096.
    c.attention_bias = false;
    c.sliding_window = window_or_default(doc, path);
  } else {
    // Llama, Mixtral and Qwen3-MoE: attention_bias puts biases on q, k, v and o_proj alike;
    // zrt's attention takes q/k/v biases only (Qwen2's form).
    if (r.opt_bool("attention_bias", false)) {
      ZRT_THROW(InvalidArgument,
                "{}: attention_bias true is not supported for {}: transformers then puts biases "
                "on q, k, v and o_proj; zrt's attention takes q/k/v biases only (Qwen2's)",
                path, c.model_type);
    }
    if (mixtral) c.sliding_window = r.opt_int("sliding_window", 0);
    // Qwen3-MoE's window applies to every layer when use_sliding_window is set.
    if (c.model_type == "qwen3_moe" && r.opt_bool("use_sliding_window", false)) {
      c.sliding_window = window_or_default(doc, path);
    }
  }
}

void read_gpt2(const json& doc, const std::string& path, HfConfig& c) {
  const Reader r(doc, path);
  c.n_layer = r.get_int("n_layer");
  c.n_head = r.get_int("n_head");
  c.n_embd = r.get_int("n_embd");
  c.vocab_size = r.get_int("vocab_size");
  c.n_positions = r.has("n_positions") ? r.get_int("n_positions") : r.get_int("n_ctx");
  c.layer_norm_epsilon = r.opt_double("layer_norm_epsilon", c.layer_norm_epsilon);
  c.activation_function = r.opt_string("activation_function", "gelu_new");
  c.tie_word_embeddings = r.opt_bool("tie_word_embeddings", true);
}

}  // namespace

const std::vector<std::string>& HfConfig::known_model_types() {
  static const std::vector<std::string> types = {"gpt2",    "llama",   "qwen2",     "qwen3",
                                                 "mistral", "mixtral", "qwen2_moe", "qwen3_moe"};
  return types;
}

HfConfig HfConfig::parse(const std::string& text, const std::string& path) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception& e) {
    ZRT_THROW(InvalidArgument, "{}: not valid JSON: {}", path, e.what());
  }
  if (!doc.is_object()) ZRT_THROW(InvalidArgument, "{}: not a JSON object", path);
  HfConfig c;
  c.path = path;
  const Reader r(doc, path);
  if (!r.has("model_type")) {
    ZRT_THROW(InvalidArgument, "{}: model_type is missing (not a transformers config.json?)", path);
  }
  c.model_type = r.opt_string("model_type", "");
  if (r.has("architectures")) {
    const json& a = doc["architectures"];
    if (!a.is_array()) ZRT_THROW(InvalidArgument, "{}: architectures is not a list", path);
    for (const json& name : a) {
      if (!name.is_string())
        ZRT_THROW(InvalidArgument, "{}: architectures holds {}", path, name.dump());
      c.architectures.push_back(name.get<std::string>());
    }
  }
  // transformers v5 writes "dtype"; v4 "torch_dtype".
  c.torch_dtype = r.opt_string("torch_dtype", r.opt_string("dtype", ""));
  c.bos_token_id = r.opt_token("bos_token_id");
  c.eos_token_id = r.opt_token("eos_token_id");
  if (c.model_type == "gpt2") {
    read_gpt2(doc, path, c);
  } else if (std::find(kLlamaFamily.begin(), kLlamaFamily.end(), c.model_type) !=
             kLlamaFamily.end()) {
    read_llama_family(doc, path, c);
  } else {
    ZRT_THROW(InvalidArgument,
              "{}: model_type '{}' is not supported (zrt reads gpt2, llama, "
              "qwen2, qwen3, mistral, mixtral, qwen2_moe, qwen3_moe)",
              path, c.model_type);
  }
  return c;
}

HfConfig HfConfig::read(const std::string& path) {
  fs::path file = path;
  if (fs::is_directory(file)) file /= "config.json";
  std::ifstream in(file);
  if (!in) {
    ZRT_THROW(InvalidArgument, "{}: cannot open (a Hugging Face model directory holds config.json)",
              file.string());
  }
  std::stringstream text;
  text << in.rdbuf();
  return parse(text.str(), file.string());
}

bool is_hf_model_dir(const std::string& path) {
  std::error_code ec;
  return !path.empty() && fs::is_directory(path, ec) &&
         fs::is_regular_file(fs::path(path) / "config.json", ec);
}

std::optional<HfConfig> hf_config_for(const std::string& init_from) {
  if (init_from.empty()) return std::nullopt;
  std::error_code ec;
  if (fs::is_directory(init_from, ec)) return HfConfig::read(init_from);
  const fs::path beside = fs::path(init_from).parent_path() / "config.json";
  if (fs::is_regular_file(beside, ec)) return HfConfig::read(beside.string());
  return std::nullopt;
}

}  // namespace zrt::hf
