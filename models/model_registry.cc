#include "models/model_registry.h"

#include <algorithm>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "models/hf/hf_export.h"
#include "runtime/common/error.h"

namespace zrt {

namespace {
std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}
}  // namespace

void ModelRegistry::add(ModelEntry entry) {
  if (entry.type.empty()) ZRT_THROW(InvalidArgument, "model registry: an entry without a type");
  if (contains(entry.type)) {
    ZRT_THROW(InvalidArgument, "model registry: model.type '{}' is registered twice", entry.type);
  }
  if (!entry.resolve || !entry.parse_spec || !entry.export_safetensors) {
    ZRT_THROW(InvalidArgument,
              "model registry: '{}' lacks a hook (resolve, parse_spec and export_safetensors "
              "are required)",
              entry.type);
  }
  entries_.push_back(std::move(entry));
}

std::vector<std::string> ModelRegistry::types() const {
  std::vector<std::string> names;
  for (const ModelEntry& e : entries_) names.push_back(e.type);
  return names;
}

bool ModelRegistry::contains(const std::string& type) const {
  for (const ModelEntry& e : entries_) {
    if (e.type == type) return true;
  }
  return false;
}

const ModelEntry& ModelRegistry::entry(const std::string& type) const {
  for (const ModelEntry& e : entries_) {
    if (e.type == type) return e;
  }
  ZRT_THROW(InvalidArgument, "unknown model.type '{}' (known: {})", type, joined(types()));
}

std::unique_ptr<ModelDef> ModelRegistry::resolve(const ModelConfig& config) const {
  const ModelEntry& e = entry(config.type);
  // A preset of another family under the default model.type (gpt2 with "llama-3.2-1b"): name
  // the type it belongs to rather than only GPT-2's presets. (An explicit type's entry names
  // its own mismatches.)
  if (!config.preset.empty() && config.type == ModelConfig{}.type &&
      std::find(e.presets.begin(), e.presets.end(), config.preset) == e.presets.end()) {
    for (const ModelEntry& other : entries_) {
      if (std::find(other.presets.begin(), other.presets.end(), config.preset) !=
          other.presets.end()) {
        ZRT_THROW(InvalidArgument,
                  "model.preset '{}' is a {} preset, but model.type is {} (the default when "
                  "none is given): set model.type to {}",
                  config.preset, other.type, config.type, other.type);
      }
    }
  }
  return e.resolve(config);
}

std::unique_ptr<ModelDef> ModelRegistry::parse_spec(const std::string& type,
                                                    const std::string& spec) const {
  return entry(type).parse_spec(spec);
}

std::unique_ptr<ModelDef> ModelRegistry::parse_spec(const std::string& spec) const {
  const auto colon = spec.find(':');
  const std::string head = spec.substr(0, colon);
  if (head.find('=') == std::string::npos) {
    for (const ModelEntry& e : entries_) {
      for (const std::string& preset : e.presets) {
        if (preset == head) return e.parse_spec(spec);
      }
    }
    if (colon != std::string::npos && contains(head)) {
      return entry(head).parse_spec(spec.substr(colon + 1));
    }
  }
  return parse_spec(ModelConfig{}.type, spec);
}

void ModelRegistry::export_safetensors(ExportInput input, const std::string& out) const {
  // The saved config's model.type; the config's own default when absent (or unreadable, so the
  // architecture's exporter reports what it misses).
  std::string type = ModelConfig{}.type;
  const auto config = nlohmann::json::parse(input.config_json, nullptr, false);
  if (!config.is_discarded() && config.contains("model") && config["model"].contains("type") &&
      config["model"]["type"].is_string()) {
    type = config["model"]["type"].get<std::string>();
  }
  entry(type).export_safetensors(std::move(input), out);
}

std::vector<std::string> ModelRegistry::export_hf(ExportInput input, const std::string& out_dir,
                                                  const HfExportOptions& options) const {
  const ModelConfig saved = saved_model_config(input.config_json, input.checkpoint);
  const ModelEntry& e = entry(saved.type);
  if (!e.hf_config) {
    ZRT_THROW(InvalidArgument, "{}: model.type '{}' cannot be exported as a Hugging Face directory",
              input.checkpoint, saved.type);
  }
  const std::string config_json = e.hf_config(input);
  if (e.hub_tensors) input.tensors = e.hub_tensors(input, std::move(input.tensors));
  return hf::write_hf_directory(std::move(input), config_json, saved.init_from, out_dir, options);
}

ModelConfig saved_model_config(const std::string& config_json, const std::string& where) {
  const auto doc = nlohmann::json::parse(config_json, nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) {
    ZRT_THROW(InvalidArgument, "{}: the saved run config is not a JSON object", where);
  }
  if (!doc.contains("model")) return ModelConfig{};
  // A model that came from a Hugging Face directory is rebuilt from its config.json: without
  // it the block alone would read as another architecture's (GPT-2's, the default).
  const nlohmann::json& block = doc["model"];
  if (block.is_object() && block.contains("init_from") && block["init_from"].is_string()) {
    const std::string from = block["init_from"].get<std::string>();
    std::error_code ec;
    if (!from.empty() && !std::filesystem::exists(from, ec)) {
      ZRT_THROW(InvalidArgument,
                "{}: the saved model comes from model.init_from {}, which is not there (moved or "
                "deleted?): the model's architecture and dimensions are read from it; put it "
                "back at that path",
                where, from);
    }
  }
  // The config's own parser reads the block (every key of every architecture, and the
  // architecture of an init_from directory), in a minimal run around it: the saved run's batch
  // and data settings do not matter here and need not fit this process.
  // model.expert_rows_reserve sizes the run's buffers under expert parallelism, not the model:
  // left out, as the run's expert_parallel block is (its warning without one would be noise).
  nlohmann::json model = doc["model"];
  if (model.is_object()) model.erase("expert_rows_reserve");
  nlohmann::json run = {{"train_batch_size", 1},
                        {"train_micro_batch_size_per_gpu", 1},
                        {"model", model},
                        {"data", {{"train", "unused"}}},
                        {"train", {{"steps", 1}}}};
  return parse_config(run, 1, where + " (its saved model block)").model;
}

std::unique_ptr<Model> make_model(const ModelConfig& config, kernels::KernelContext& ctx,
                                  const ModelOptions& options) {
  return builtin_models().resolve(config)->build(ctx, options);
}

}  // namespace zrt
