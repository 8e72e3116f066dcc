#include "models/llama/llama_model_def.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <utility>

#include <nlohmann/json.hpp>

#include "kernels/ops.h"
#include "kernels/ulysses_ops.h"
#include "models/hf/hf_config.h"
#include "models/hf/hf_import.h"
#include "models/llama/llama.h"
#include "models/model_registry.h"
#include "models/rope_scaling_check.h"
#include "models/safetensors.h"
#include "models/transformer/swiglu_mlp_tiles.h"
#include "models/transformer/transformer_activations.h"
#include "models/transformer/transformer_def.h"
#include "runtime/common/error.h"

namespace zrt::llama {

namespace {

class LlamaDef final : public transformer::TransformerDefOf<LlamaDef, LlamaConfig, Llama> {
 public:
  using TransformerDefOf::TransformerDefOf;

  const std::string& type() const override { return config().architecture; }
  std::vector<std::pair<std::string, std::int64_t>> dimensions() const override {
    const LlamaConfig& c = config();
    return {{"hidden_size", c.hidden_size},
            {"intermediate_size", c.intermediate_size},
            {"num_hidden_layers", c.num_hidden_layers},
            {"num_attention_heads", c.num_attention_heads},
            {"num_key_value_heads", c.num_key_value_heads},
            {"head_dim", c.head_dim},
            {"vocab_size", c.vocab_size},
            {"max_position_embeddings", c.max_position_embeddings},
            {"seq_len", c.seq_len}};
  }
  double flops_per_token(int seq_len) const override {
    return llama::flops_per_token(config(), seq_len);
  }
  std::int64_t activation_bytes(int B, int T, DType dtype,
                                bool activation_checkpointing) const override {
    return Llama::activation_bytes(config(), B, T, dtype, activation_checkpointing);
  }
  TileRows tile_rows(int B, int T, DType dtype, const ModelOptions& options) const override {
    const LlamaOptions o = transformer::transformer_options(options);
    const std::int64_t N = std::int64_t{B} * T, S = static_cast<std::int64_t>(dtype_size(dtype));
    return {transformer::head_tile_rows(config().vocab_size, o, N, S),
            transformer::swiglu_tile_rows(config().intermediate_size, o.mlp_tile_rows, N, S), 0};
  }
  ActivationFootprint activation_footprint(int B, int T, DType dtype,
                                           const ModelOptions& options) const override {
    const LlamaOptions o = transformer::transformer_options(options);
    return {Llama::activation_bytes(config(), B, T, dtype, o),
            Llama::host_activation_bytes(config(), B, T, dtype, o)};
  }
  // The grouped-query attention over the whole sequence (sp * T) with this rank's query and
  // key/value heads (Ulysses' shares, kernels/ulysses_ops.h).
  std::int64_t kernel_workspace_bytes(int B, int T, DType dtype, const ModelOptions& options,
                                      bool on_cpu) const override {
    const int sp = transformer::transformer_options(options).sequence_parallel_size();
    const LlamaConfig& c = config();
    int NH = c.num_attention_heads, NKV = c.num_key_value_heads;
    if (sp > 1) {
      NKV = kernels::ulysses_kv_heads(NH, NKV, sp).block_heads;
      NH = kernels::ulysses_query_heads(NH, sp).block_heads;
    }
    const kernels::KernelOptions kernel_options;
    const auto request = [&](bool backward) {
      return kernels::gqa_attention_workspace_bytes(on_cpu, kernel_options, dtype, B, sp * T, NH,
                                                    NKV, c.head_dim, backward,
                                                    options.planned_documents);
    };
    return transformer::attention_workspace_growth(request(false), request(true));
  }

 protected:
  int n_layer() const override { return config().num_hidden_layers; }
  ParamInitializer hf_weights_initializer(const Model& model,
                                          const std::string& init_from) const override {
    // transformers' names are the model's: every tensor of the files is used (or is a known
    // buffer, or a tied copy equal to its parameter), an untied head is never dropped.
    return hf::hf_initializer(init_from, model.parameters(), hf::llama_family_rules());
  }
};

const char* hf_architecture(const std::string& architecture) {
  if (architecture == "qwen2") return "Qwen2ForCausalLM";
  if (architecture == "qwen3") return "Qwen3ForCausalLM";
  if (architecture == "mistral") return "MistralForCausalLM";
  return "LlamaForCausalLM";
}

// The spec of a saved config's model block (JSON), as ModelConfig::spec() writes it.
std::string spec_of_saved_block(const nlohmann::json& m) {
  std::string preset = m.value("preset", std::string());
  std::vector<std::string> items;
  for (const auto& [key, value] : m.items()) {
    if (key == "type" || key == "preset" || key == "activation_checkpointing" ||
        key == "init_from") {
      continue;
    }
    if (key == "rope_scaling" && value.is_object()) {
      for (const auto& [sub, v] : value.items()) {
        items.push_back("rope_scaling." + sub + "=" +
                        (v.is_string() ? v.get<std::string>() : v.dump()));
      }
      continue;
    }
    items.push_back(key + "=" + (value.is_string() ? value.get<std::string>() : value.dump()));
  }
  std::string rest;
  for (const std::string& item : items) rest += (rest.empty() ? "" : ",") + item;
  if (preset.empty()) return rest;
  return rest.empty() ? preset : preset + ":" + rest;
}

nlohmann::json hf_config_of(const std::string& architecture, const LlamaConfig& c);

// Hugging Face safetensors: the tensors under zrt's names (which are transformers') in fp32,
// and a config.json for LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM /
// MistralForCausalLM beside them.
void export_llama(const std::string& architecture, ExportInput input, const std::string& out) {
  const std::string& dir = input.checkpoint;
  const auto saved = nlohmann::json::parse(input.config_json, nullptr, false);
  if (saved.is_discarded() || !saved.contains("model") || !saved["model"].is_object()) {
    ZRT_THROW(InvalidArgument, "{}: the saved config has no model block", dir);
  }
  const LlamaConfig c = LlamaConfig::parse(architecture, spec_of_saved_block(saved["model"]));
  const std::vector<ParamSpec> table = Llama::parameter_table(c);
  if (table.size() != input.tensors.size()) {
    ZRT_THROW(InvalidArgument, "{}: {} tensors, but a {} has {}", dir, input.tensors.size(),
              c.describe(), table.size());
  }
  std::vector<std::pair<std::string, std::pair<std::vector<std::int64_t>, std::vector<float>>>>
      tensors;
  for (std::size_t i = 0; i < table.size(); ++i) {
    ExportTensor& t = input.tensors[i];
    if (t.name != table[i].name || t.shape != table[i].shape) {
      ZRT_THROW(InvalidArgument, "{}: tensor {} is {}, expected {} of {}", dir, i, t.name,
                table[i].name, c.describe());
    }
    tensors.emplace_back(t.name, std::make_pair(t.shape, std::move(t.values)));
  }
  write_safetensors(out, tensors, {{"format", "pt"}});
  const std::filesystem::path config_path =
      std::filesystem::path(out).parent_path() / "config.json";
  std::ofstream config_file(config_path);
  config_file << hf_config_of(architecture, c).dump(2) << "\n";
  config_file.flush();
  if (!config_file) {
    ZRT_THROW(Error, "{}: cannot write: {}", config_path.string(), std::strerror(errno));
  }
}

// transformers' config.json of a LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM /
// MistralForCausalLM.
nlohmann::json hf_config_of(const std::string& architecture, const LlamaConfig& c) {
  nlohmann::json hf;
  hf["architectures"] = {hf_architecture(architecture)};
  hf["model_type"] = architecture;
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
  if (architecture != "qwen2") hf["attention_bias"] = c.attention_bias;
  hf["sliding_window"] = c.sliding_window > 0 ? nlohmann::json(c.sliding_window) : nullptr;
  if (c.windows_from_layer()) {
    // Qwen2Config and Qwen3Config drop sliding_window unless use_sliding_window, and apply it
    // from max_window_layers on.
    const bool windowed = c.sliding_window > 0 && c.max_window_layers < c.num_hidden_layers;
    hf["use_sliding_window"] = windowed;
    hf["max_window_layers"] = windowed ? c.max_window_layers : c.num_hidden_layers;
  }
  hf["hidden_act"] = "silu";
  hf["torch_dtype"] = "float32";
  return hf;
}

// The architecture of a Hugging Face config.json, with the run's model keys (explicit, or its
// preset's) checked against it: a contradiction names both values.
LlamaConfig config_from_hf(const hf::HfConfig& hf, const ModelConfig& run) {
  const std::string& path = hf.path;
  if (hf.model_type != run.type) {
    ZRT_THROW(InvalidArgument, "model.type '{}' contradicts {} model_type '{}'", run.type, path,
              hf.model_type);
  }
  LlamaConfig c;
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
  c.max_window_layers = hf.max_window_layers;
  c.seq_len = run.seq_len ? *run.seq_len : std::min(c.max_position_embeddings, 8192);
  std::optional<LlamaConfig> preset;
  if (!run.preset.empty()) {
    preset = LlamaConfig::preset(run.preset);
    c.name = run.preset;
  }
  auto check = [&](const char* key, auto file_value, auto run_value, auto preset_value) {
    if (run_value) {
      if (*run_value != file_value) {
        ZRT_THROW(InvalidArgument, "model.{} {} contradicts {} {} {}", key, *run_value, path, key,
                  file_value);
      }
    } else if (preset && preset_value != file_value) {
      ZRT_THROW(InvalidArgument, "model.preset '{}' ({} {}) contradicts {} {} {}", run.preset, key,
                preset_value, path, key, file_value);
    }
  };
  const LlamaConfig p = preset.value_or(c);
  check("hidden_size", c.hidden_size, run.hidden_size, p.hidden_size);
  check("intermediate_size", c.intermediate_size, run.intermediate_size, p.intermediate_size);
  check("num_hidden_layers", c.num_hidden_layers, run.num_hidden_layers, p.num_hidden_layers);
  check("num_attention_heads", c.num_attention_heads, run.num_attention_heads,
        p.num_attention_heads);
  check("num_key_value_heads", c.num_key_value_heads, run.num_key_value_heads,
        p.num_key_value_heads);
  check("head_dim", c.head_dim, run.head_dim, p.head_dim);
  check("vocab_size", c.vocab_size, run.vocab_size, p.vocab_size);
  check("max_position_embeddings", c.max_position_embeddings, run.max_position_embeddings,
        p.max_position_embeddings);
  check("rms_norm_eps", c.rms_norm_eps, run.rms_norm_eps, p.rms_norm_eps);
  check("rope_theta", c.rope_theta, run.rope_theta, p.rope_theta);
  check("tie_word_embeddings", c.tie_word_embeddings, run.tie_word_embeddings,
        p.tie_word_embeddings);
  check("attention_bias", c.attention_bias, run.attention_bias, p.attention_bias);
  check("sliding_window", c.sliding_window, run.sliding_window, p.sliding_window);
  check("max_window_layers", c.max_window_layers, run.max_window_layers, p.max_window_layers);
  check_run_rope_scaling(c.rope_scaling, run.rope_scaling, preset ? &p.rope_scaling : nullptr,
                         run.preset, path);
  c.validate();
  return c;
}

}  // namespace

LlamaConfig resolve_config(const ModelConfig& config) {
  // A Hugging Face directory (or a file with its config.json beside it) gives the dimensions;
  // the run's keys must agree with them.
  if (const auto hf = hf::hf_config_for(config.init_from)) return config_from_hf(*hf, config);
  return LlamaConfig::parse(config.type, config.spec());
}

ModelEntry registry_entry(const std::string& architecture) {
  ModelEntry entry;
  entry.type = architecture;
  std::string presets;
  for (const std::string& name : LlamaConfig::preset_names()) {
    if (LlamaConfig::preset(name).architecture != architecture) continue;
    entry.presets.push_back(name);
    presets += (presets.empty() ? "" : ", ") + name;
  }
  const char* family = architecture == "qwen2"     ? "Qwen2/Qwen2.5"
                       : architecture == "qwen3"   ? "Qwen3 (dense)"
                       : architecture == "mistral" ? "Mistral"
                                                   : "Llama 2/3/3.1/3.2";
  entry.summary = presets.empty() ? fmt::format("{} (no presets: give the dimensions)", family)
                                  : fmt::format("{} (presets {})", family, presets);
  entry.resolve = [](const ModelConfig& config) -> std::unique_ptr<ModelDef> {
    return std::make_unique<LlamaDef>(resolve_config(config));
  };
  entry.parse_spec = [architecture](const std::string& spec) -> std::unique_ptr<ModelDef> {
    return std::make_unique<LlamaDef>(LlamaConfig::parse(architecture, spec));
  };
  entry.export_safetensors = [architecture](ExportInput input, const std::string& out) {
    export_llama(architecture, std::move(input), out);
  };
  // zrt-ckpt export --hf: transformers' config.json of the saved model.
  entry.hf_config = [architecture](const ExportInput& input) {
    const ModelConfig saved = saved_model_config(input.config_json, input.checkpoint);
    return hf_config_of(architecture, resolve_config(saved)).dump(2);
  };
  return entry;
}

double flops_per_token(const LlamaConfig& c, int T) {
  const double looked_up = c.tie_word_embeddings ? 0.0 : double(c.vocab_size) * c.hidden_size;
  return 6.0 * (static_cast<double>(c.num_parameters()) - looked_up) +
         12.0 * c.num_hidden_layers * double(c.num_attention_heads) * c.head_dim * T;
}

}  // namespace zrt::llama
