#include "models/gpt/gpt_config.h"

#include "models/param_count_text.h"
#include "models/spec_values.h"
#include "runtime/common/error.h"

namespace zrt::gpt {

namespace {

int parse_int_value(const std::string& key, const std::string& value) {
  return spec_int("gpt", key, value);
}

struct Preset {
  const char* name;
  int n_layer, n_head, n_embd, vocab_size, seq_len;
};
constexpr Preset kPresets[] = {
    {"gpt2-tiny", 2, 4, 64, 256, 256},          {"gpt2", 12, 12, 768, 50257, 1024},
    {"gpt2-medium", 24, 16, 1024, 50257, 1024}, {"gpt2-large", 36, 20, 1280, 50257, 1024},
    {"gpt2-xl", 48, 25, 1600, 50257, 1024},
};

}  // namespace

std::vector<std::string> GptConfig::preset_names() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.emplace_back(p.name);
  return names;
}

GptConfig GptConfig::preset(const std::string& name) {
  for (const Preset& p : kPresets) {
    if (name == p.name) {
      GptConfig c;
      c.name = p.name;
      c.n_layer = p.n_layer;
      c.n_head = p.n_head;
      c.n_embd = p.n_embd;
      c.vocab_size = p.vocab_size;
      c.seq_len = p.seq_len;
      return c;
    }
  }
  std::string names;
  for (const Preset& p : kPresets) names += std::string(names.empty() ? "" : ", ") + p.name;
  ZRT_THROW(InvalidArgument, "unknown GPT preset '{}'; presets: {}", name, names);
}

GptConfig GptConfig::parse(const std::string& spec) {
  GptConfig c;
  std::string rest = spec;
  if (spec.find('=') == std::string::npos) {
    c = preset(spec);
    c.validate();
    return c;
  }
  // A preset with keys changed is named after it (messages say which model it started from).
  std::string modified = "custom";
  if (const auto colon = spec.find(':'); colon != std::string::npos) {
    c = preset(spec.substr(0, colon));
    rest = spec.substr(colon + 1);
    modified = spec.substr(0, colon) + " (modified)";
  }
  for (const auto& [key, text] : spec_items("gpt", rest)) {
    const int value = parse_int_value(key, text);
    if (key == "n_layer") {
      c.n_layer = value;
    } else if (key == "n_head") {
      c.n_head = value;
    } else if (key == "n_embd") {
      c.n_embd = value;
    } else if (key == "vocab_size") {
      c.vocab_size = value;
    } else if (key == "seq_len") {
      c.seq_len = value;
    } else {
      ZRT_THROW(InvalidArgument,
                "gpt config: unknown key '{}' (n_layer, n_head, n_embd, vocab_size, seq_len)", key);
    }
    c.name = modified;
  }
  c.validate();
  return c;
}

void GptConfig::validate() const {
  if (n_layer <= 0 || n_head <= 0 || n_embd <= 0 || vocab_size <= 0 || seq_len <= 0) {
    ZRT_THROW(InvalidArgument,
              "gpt config {}: n_layer={} n_head={} n_embd={} vocab_size={} seq_len={} must all "
              "be positive",
              name, n_layer, n_head, n_embd, vocab_size, seq_len);
  }
  if (n_embd % n_head != 0) {
    ZRT_THROW(InvalidArgument, "gpt config {}: n_embd={} is not a multiple of n_head={}", name,
              n_embd, n_head);
  }
}

std::int64_t GptConfig::num_parameters() const {
  const std::int64_t C = n_embd;
  return std::int64_t{vocab_size} * C + std::int64_t{seq_len} * C +
         std::int64_t{n_layer} * (12 * C * C + 13 * C) + 2 * C;
}

std::string GptConfig::describe() const {
  return fmt::format("{} (L{} H{} C{} V{} T{}, {} params)", name, n_layer, n_head, n_embd,
                     vocab_size, seq_len, param_count_text(num_parameters()));
}

}  // namespace zrt::gpt
