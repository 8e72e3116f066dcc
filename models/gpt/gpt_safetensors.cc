#include "models/gpt/gpt_safetensors.h"

#include <algorithm>
#include <set>

#include "models/safetensors.h"
#include "runtime/common/error.h"

namespace zrt::gpt {

namespace {
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

GptWeights::GptWeights(const std::string& path, const std::vector<ParamSpec>& params) {
  const SafetensorsFile file(path);
  std::set<std::string> used;
  for (const ParamSpec& p : params) {
    std::string name = p.name;
    if (file.tensors().count(name) == 0 && name.rfind("transformer.", 0) == 0) {
      name = name.substr(12);  // hub files often lack the prefix
    }
    const auto it = file.tensors().find(name);
    if (it == file.tensors().end()) {
      ZRT_THROW(InvalidArgument,
                "{}: no tensor for parameter '{}' (with or without the "
                "'transformer.' prefix)",
                path, p.name);
    }
    if (it->second.shape != p.shape) {
      std::string want, got;
      for (auto d : p.shape) want += (want.empty() ? "" : ", ") + std::to_string(d);
      for (auto d : it->second.shape) got += (got.empty() ? "" : ", ") + std::to_string(d);
      ZRT_THROW(InvalidArgument, "{}: tensor '{}' has shape ({}) but the model's '{}' is ({})",
                path, name, got, p.name, want);
    }
    used.insert(name);
    values_.push_back(file.read_f32(name));
  }
  for (const auto& [name, entry] : file.tensors()) {
    if (used.count(name) != 0) continue;
    if (ends_with(name, "attn.bias") || ends_with(name, "attn.masked_bias") ||
        ends_with(name, "lm_head.weight")) {
      continue;  // causal-mask buffers; the head is tied to wte
    }
    ZRT_THROW(InvalidArgument,
              "{}: tensor '{}' matches no parameter of this model (another "
              "architecture or size?)",
              path, name);
  }
}

void GptWeights::read(int index, std::int64_t first, std::int64_t count, float* out) const {
  const auto& v = values_.at(static_cast<std::size_t>(index));
  ZRT_CHECK(first >= 0 && first + count <= static_cast<std::int64_t>(v.size()),
            "read of [{}, {}) from a parameter of {} elements", first, first + count, v.size());
  std::copy(v.begin() + first, v.begin() + first + count, out);
}

}  // namespace zrt::gpt
