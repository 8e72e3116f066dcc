#include "models/hf/hf_import.h"

#include <memory>
#include <set>

#include "models/hf/hf_weights.h"
#include "runtime/common/error.h"

namespace zrt::hf {

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + ")";
}

HfImportRules llama_family_rules() {
  HfImportRules rules;
  rules.ignorable = [](const std::string& tensor) {
    const std::string suffix = "rotary_emb.inv_freq";
    return tensor.size() >= suffix.size() &&
           tensor.compare(tensor.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  // Applies only when the model has no lm_head.weight parameter (a tied head).
  rules.tied = {{"lm_head.weight", "model.embed_tokens.weight"}};
  return rules;
}

HfParamSource::HfParamSource(const std::string& path, const std::vector<ParamSpec>& params,
                             const HfImportRules& rules)
    : weights_(std::make_shared<const HfWeights>(path)) {
  const HfWeights& w = *weights_;
  std::set<std::string> used;
  std::map<std::string, int> index_of;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const ParamSpec& p = params[i];
    index_of[p.name] = static_cast<int>(i);
    std::vector<std::string> candidates = {p.name};
    if (rules.aliases) {
      for (const std::string& a : rules.aliases(p.name)) candidates.push_back(a);
    }
    std::string found;
    for (const std::string& c : candidates) {
      if (w.contains(c)) {
        found = c;
        break;
      }
    }
    if (found.empty()) {
      std::string tried;
      for (std::size_t c = 1; c < candidates.size(); ++c) tried += ", '" + candidates[c] + "'";
      ZRT_THROW(InvalidArgument, "{}: no tensor for parameter '{}'{}", w.path(), p.name,
                tried.empty() ? "" : " (nor" + tried.substr(1) + ")");
    }
    const SafetensorsEntry& e = w.entry(found);
    if (e.shape != p.shape) {
      ZRT_THROW(InvalidArgument, "{}: tensor '{}' has shape {} but the model's '{}' is {}",
                w.file_of(found), found, shape_text(e.shape), p.name, shape_text(p.shape));
    }
    if (used.count(found) != 0) {
      ZRT_THROW(InvalidArgument, "{}: tensor '{}' would feed two parameters", w.file_of(found),
                found);
    }
    used.insert(found);
    tensors_.push_back(found);
  }
  for (const std::string& name : w.names()) {
    if (used.count(name) != 0) continue;
    if (rules.ignorable && rules.ignorable(name)) continue;
    const auto tie = rules.tied.find(name);
    if (tie != rules.tied.end() && index_of.count(tie->second) != 0) {
      // A copy of a tied parameter: kept only if it is one.
      const std::string& source = tensors_[static_cast<std::size_t>(index_of[tie->second])];
      if (w.entry(name).shape == w.entry(source).shape && w.read_f32(name) == w.read_f32(source)) {
        continue;
      }
      ZRT_THROW(InvalidArgument,
                "{}: tensor '{}' differs from '{}': an untied output head, but this model ties "
                "it to '{}' (set tie_word_embeddings false in config.json for an architecture "
                "with an untied head, or drop the tensor)",
                w.file_of(name), name, source, tie->second);
    }
    ZRT_THROW(InvalidArgument,
              "{}: tensor '{}' matches no parameter of this model (another architecture or "
              "size?)",
              w.file_of(name), name);
  }
}

void HfParamSource::read(int index, std::int64_t first, std::int64_t count, float* out) const {
  ZRT_CHECK(index >= 0 && index < static_cast<int>(tensors_.size()), "read of parameter {} of {}",
            index, tensors_.size());
  weights_->read_f32(tensors_[static_cast<std::size_t>(index)], first, count, out);
}

ParamInitializer hf_initializer(const std::string& path, const std::vector<ParamSpec>& params,
                                const HfImportRules& rules) {
  auto source = std::make_shared<const HfParamSource>(path, params, rules);
  return [source](int index, std::int64_t first, std::int64_t count, float* out) {
    source->read(index, first, count, out);
  };
}

}  // namespace zrt::hf
