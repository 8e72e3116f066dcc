#include "models/gpt/gpt_safetensors.h"

#include <optional>
#include <utility>

#include "config/config.h"
#include "runtime/common/error.h"

namespace zrt::gpt {

namespace {
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

hf::HfImportRules import_rules() {
  hf::HfImportRules rules;
  rules.aliases = [](const std::string& name) -> std::vector<std::string> {
    if (name.rfind("transformer.", 0) == 0) return {name.substr(12)};  // hub files lack it
    return {};
  };
  rules.ignorable = [](const std::string& tensor) {
    return ends_with(tensor, "attn.bias") || ends_with(tensor, "attn.masked_bias");
  };
  rules.tied = {{"lm_head.weight", "transformer.wte.weight"}};
  return rules;
}

GptWeights::GptWeights(const std::string& path, const std::vector<ParamSpec>& params)
    : source_(std::make_shared<const hf::HfParamSource>(path, params, import_rules())) {}

void GptWeights::read(int index, std::int64_t first, std::int64_t count, float* out) const {
  source_->read(index, first, count, out);
}

GptConfig config_from_hf(const hf::HfConfig& hf, const ModelConfig& run) {
  const std::string& path = hf.path;
  if (hf.model_type != "gpt2") {
    ZRT_THROW(InvalidArgument, "model.type '{}' contradicts {} model_type '{}'", run.type, path,
              hf.model_type);
  }
  if (!hf.tie_word_embeddings) {
    ZRT_THROW(InvalidArgument,
              "{}: tie_word_embeddings is false, but zrt's GPT-2 ties its head to wte", path);
  }
  if (hf.activation_function != "gelu_new" && hf.activation_function != "gelu_pytorch_tanh") {
    ZRT_THROW(InvalidArgument,
              "{}: activation_function '{}': zrt's GPT-2 computes the tanh GELU (gelu_new)", path,
              hf.activation_function);
  }
  if (hf.layer_norm_epsilon != 1e-5) {
    ZRT_THROW(InvalidArgument, "{}: layer_norm_epsilon {}: zrt's GPT-2 uses 1e-5", path,
              hf.layer_norm_epsilon);
  }
  GptConfig c;
  c.name = "custom";
  c.n_layer = hf.n_layer;
  c.n_head = hf.n_head;
  c.n_embd = hf.n_embd;
  c.vocab_size = hf.vocab_size;
  c.seq_len = hf.n_positions;
  const std::pair<const char*, int> file_dims[] = {{"n_layer", c.n_layer},
                                                   {"n_head", c.n_head},
                                                   {"n_embd", c.n_embd},
                                                   {"vocab_size", c.vocab_size},
                                                   {"seq_len", c.seq_len}};
  auto file_key = [](const std::string& key) {
    return key == "seq_len" ? std::string("n_positions") : key;
  };
  // Each dimension the run sets (an explicit key, else its preset's) must be the file's.
  std::optional<GptConfig> preset;
  if (!run.preset.empty()) {
    preset = GptConfig::preset(run.preset);
    c.name = run.preset;
  }
  const std::optional<int> run_dims[] = {run.n_layer, run.n_head, run.n_embd, run.vocab_size,
                                         run.seq_len};
  for (int i = 0; i < 5; ++i) {
    const char* key = file_dims[i].first;
    const int file_value = file_dims[i].second;
    if (run_dims[i]) {
      if (*run_dims[i] != file_value) {
        ZRT_THROW(InvalidArgument, "model.{} {} contradicts {} {} {}", key, *run_dims[i], path,
                  file_key(key), file_value);
      }
    } else if (preset) {
      const int preset_dims[] = {preset->n_layer, preset->n_head, preset->n_embd,
                                 preset->vocab_size, preset->seq_len};
      if (preset_dims[i] != file_value) {
        ZRT_THROW(InvalidArgument, "model.preset '{}' ({} {}) contradicts {} {} {}", run.preset,
                  key, preset_dims[i], path, file_key(key), file_value);
      }
    }
  }
  c.validate();
  return c;
}

}  // namespace zrt::gpt
