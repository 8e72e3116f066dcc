#include "models/hf/hf_import.h"

#include <algorithm>
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
    const std::vector<HfPiece> pieces =
        found.empty() && rules.pieces ? rules.pieces(p.name) : std::vector<HfPiece>{};
    if (found.empty() && !pieces.empty() && w.contains(pieces.front().name)) {
      // The parameter in pieces: each must be there with its shape, and they must fill it.
      std::vector<Source> sources;
      std::int64_t total = 0;
      for (const HfPiece& piece : pieces) {
        if (!w.contains(piece.name)) {
          ZRT_THROW(InvalidArgument, "{}: no tensor '{}' (a piece of parameter '{}')", w.path(),
                    piece.name, p.name);
        }
        const SafetensorsEntry& e = w.entry(piece.name);
        if (e.shape != piece.shape) {
          ZRT_THROW(InvalidArgument, "{}: tensor '{}' has shape {} but a piece of '{}' is {}",
                    w.file_of(piece.name), piece.name, shape_text(e.shape), p.name,
                    shape_text(piece.shape));
        }
        if (used.count(piece.name) != 0) {
          ZRT_THROW(InvalidArgument, "{}: tensor '{}' would feed two parameters",
                    w.file_of(piece.name), piece.name);
        }
        used.insert(piece.name);
        std::int64_t numel = 1;
        for (std::int64_t d : piece.shape) numel *= d;
        sources.push_back({piece.name, numel});
        total += numel;
      }
      ZRT_CHECK(total == p.numel(), "pieces of {}: {} elements for {}", p.name, total, p.numel());
      tensors_.push_back(std::move(sources));
      continue;
    }
    if (found.empty()) {
      std::string tried;
      for (std::size_t c = 1; c < candidates.size(); ++c) tried += ", '" + candidates[c] + "'";
      if (!pieces.empty()) tried += ", '" + pieces.front().name + "', ...";
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
    tensors_.push_back({{found, p.numel()}});
  }
  for (const std::string& name : w.names()) {
    if (used.count(name) != 0) continue;
    if (rules.ignorable && rules.ignorable(name)) continue;
    const auto tie = rules.tied.find(name);
    if (tie != rules.tied.end() && index_of.count(tie->second) != 0) {
      // A copy of a tied parameter: kept only if it is one.
      const std::string& source = tensor_of(index_of[tie->second]);
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
  // Across the pieces the elements [first, first + count) fall in, in order.
  std::int64_t begin = 0;
  for (const Source& piece : tensors_[static_cast<std::size_t>(index)]) {
    const std::int64_t end = begin + piece.numel;
    const std::int64_t lo = std::max(first, begin), hi = std::min(first + count, end);
    if (lo < hi) weights_->read_f32(piece.name, lo - begin, hi - lo, out + (lo - first));
    begin = end;
  }
}

ParamInitializer hf_initializer(const std::string& path, const std::vector<ParamSpec>& params,
                                const HfImportRules& rules) {
  auto source = std::make_shared<const HfParamSource>(path, params, rules);
  return [source](int index, std::int64_t first, std::int64_t count, float* out) {
    source->read(index, first, count, out);
  };
}

}  // namespace zrt::hf
