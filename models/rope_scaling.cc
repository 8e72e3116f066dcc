#include "models/rope_scaling.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <type_traits>

#include "models/rope_scaling_check.h"
#include "models/spec_values.h"
#include "runtime/common/error.h"

namespace zrt {

kernels::RopeScalingParams RopeScaling::params() const {
  kernels::RopeScalingParams p;
  p.rope_type = rope_type;
  p.factor = factor;
  p.low_freq_factor = low_freq_factor;
  p.high_freq_factor = high_freq_factor;
  p.original_max_position_embeddings = original_max_position_embeddings;
  p.attention_factor = attention_factor;
  p.beta_fast = beta_fast;
  p.beta_slow = beta_slow;
  p.mscale = mscale;
  p.mscale_all_dim = mscale_all_dim;
  p.truncate = truncate;
  return p;
}

nlohmann::json RopeScaling::hf_json() const {
  if (rope_type == "llama3") {
    return {{"rope_type", "llama3"},
            {"factor", factor},
            {"low_freq_factor", low_freq_factor},
            {"high_freq_factor", high_freq_factor},
            {"original_max_position_embeddings", original_max_position_embeddings}};
  }
  if (rope_type == "linear") return {{"rope_type", "linear"}, {"factor", factor}};
  if (rope_type == "yarn") {
    // The keys the model was given; absent ones are transformers' defaults as they are zrt's.
    nlohmann::json yarn = {{"rope_type", "yarn"},
                           {"factor", factor},
                           {"original_max_position_embeddings", original_max_position_embeddings}};
    if (attention_factor > 0) yarn["attention_factor"] = attention_factor;
    if (beta_fast > 0) yarn["beta_fast"] = beta_fast;
    if (beta_slow > 0) yarn["beta_slow"] = beta_slow;
    if (mscale > 0) yarn["mscale"] = mscale;
    if (mscale_all_dim > 0) yarn["mscale_all_dim"] = mscale_all_dim;
    if (!truncate) yarn["truncate"] = false;
    return yarn;
  }
  return nullptr;
}

std::int64_t RopeScaling::position_limit(int max_position_embeddings) const {
  std::int64_t limit = max_position_embeddings;
  if (rope_type == "yarn" && factor >= 1) {
    limit = std::max(
        limit, static_cast<std::int64_t>(std::floor(factor * original_max_position_embeddings)));
  }
  return limit;
}

std::string RopeScaling::position_limit_error(int seq_len, int max_position_embeddings) const {
  if (rope_type == "yarn") {
    return fmt::format(
        "model.seq_len={} exceeds max_position_embeddings={} and yarn's "
        "original_max_position_embeddings x factor = {} x {} = {}: raise rope_scaling.factor "
        "(config.json's, with init_from) or shorten seq_len",
        seq_len, max_position_embeddings, original_max_position_embeddings, factor,
        static_cast<std::int64_t>(std::floor(factor * original_max_position_embeddings)));
  }
  return fmt::format(
      "model.seq_len={} exceeds max_position_embeddings={}: shorten seq_len; for a model "
      "trained from scratch, raise model.max_position_embeddings to at least {}; to train "
      "pretrained weights past their positions, rotary scaling (model.rope_scaling, in "
      "config.json with init_from: rope_type yarn with factor x "
      "original_max_position_embeddings >= {}; Qwen's model cards give factor 4 over 32768)",
      seq_len, max_position_embeddings, seq_len, seq_len);
}

std::string RopeScaling::describe() const {
  if (rope_type == "yarn") {
    return fmt::format(" yarn x{} of {}", factor, original_max_position_embeddings);
  }
  if (rope_type == "linear") return fmt::format(" linear x{}", factor);
  return "";
}

bool set_rope_scaling_key(RopeScaling& s, const char* family, const std::string& key,
                          const std::string& value, bool& original_given) {
  const auto number = [&](double& field) { field = spec_double(family, key, value); };
  if (key == "rope_scaling.rope_type") {
    s.rope_type = value;
  } else if (key == "rope_scaling.factor") {
    number(s.factor);
  } else if (key == "rope_scaling.low_freq_factor") {
    number(s.low_freq_factor);
  } else if (key == "rope_scaling.high_freq_factor") {
    number(s.high_freq_factor);
  } else if (key == "rope_scaling.original_max_position_embeddings") {
    s.original_max_position_embeddings = spec_int(family, key, value);
    original_given = true;
  } else if (key == "rope_scaling.attention_factor") {
    number(s.attention_factor);
  } else if (key == "rope_scaling.beta_fast") {
    number(s.beta_fast);
  } else if (key == "rope_scaling.beta_slow") {
    number(s.beta_slow);
  } else if (key == "rope_scaling.mscale") {
    number(s.mscale);
  } else if (key == "rope_scaling.mscale_all_dim") {
    number(s.mscale_all_dim);
  } else if (key == "rope_scaling.truncate") {
    s.truncate = spec_bool(family, key, value);
  } else {
    return false;
  }
  return true;
}

void require_yarn_original(const RopeScaling& s, bool original_given,
                           const std::string& architecture) {
  if (s.rope_type == "yarn" && !original_given) {
    ZRT_THROW(InvalidArgument,
              "{} config: model.rope_scaling.original_max_position_embeddings is required with "
              "rope_type yarn (the context the model was pretrained at: 32768 for Qwen2.5 and "
              "Qwen3)",
              architecture);
  }
}

namespace {

// A value of config.json's for a message: yarn's optional keys hold 0 where the file has none.
template <typename T>
std::string shown(const T& value, bool absent_when_zero) {
  if constexpr (std::is_arithmetic_v<T>) {
    if (absent_when_zero && value == T{}) return "absent";
  }
  return fmt::format("{}", value);
}

// The run's value of `key` against the file's (both their effective values: `file` with yarn's
// defaults put in where it has none), then against the preset's.
template <typename T>
void check_key(const char* key, const T& file, const std::optional<T>& run, const T* preset,
               const std::string& preset_name, const std::string& path,
               bool absent_when_zero = false) {
  if (run) {
    if (*run != file) {
      ZRT_THROW(InvalidArgument,
                "model.rope_scaling.{} {} contradicts {} rope_scaling.{} ({}): drop the key, or "
                "give config.json's value",
                key, *run, path, key, shown(file, absent_when_zero));
    }
  } else if (preset != nullptr && *preset != file) {
    ZRT_THROW(InvalidArgument,
              "model.preset '{}' (rope_scaling.{} {}) contradicts {} rope_scaling.{} ({})",
              preset_name, key, *preset, path, key, shown(file, absent_when_zero));
  }
}

}  // namespace

void check_run_rope_scaling(const RopeScaling& file, const ModelConfig::RopeScaling& r,
                            const RopeScaling* preset, const std::string& preset_name,
                            const std::string& path) {
  // The betas where a config has none are their defaults: a run giving those agrees.
  const auto effective = [](RopeScaling s) {
    if (s.beta_fast == 0) s.beta_fast = kernels::kYarnBetaFast;
    if (s.beta_slow == 0) s.beta_slow = kernels::kYarnBetaSlow;
    return s;
  };
  const RopeScaling f = effective(file);
  const std::optional<RopeScaling> preset_values =
      preset != nullptr ? std::optional<RopeScaling>(effective(*preset)) : std::nullopt;
  const RopeScaling* p = preset_values ? &*preset_values : nullptr;
  const auto field = [&](auto member) { return p != nullptr ? &(p->*member) : nullptr; };
  check_key("rope_type", f.rope_type, r.rope_type, field(&RopeScaling::rope_type), preset_name,
            path);
  check_key("factor", f.factor, r.factor, field(&RopeScaling::factor), preset_name, path);
  check_key("low_freq_factor", f.low_freq_factor, r.low_freq_factor,
            field(&RopeScaling::low_freq_factor), preset_name, path);
  check_key("high_freq_factor", f.high_freq_factor, r.high_freq_factor,
            field(&RopeScaling::high_freq_factor), preset_name, path);
  check_key("original_max_position_embeddings", f.original_max_position_embeddings,
            r.original_max_position_embeddings,
            field(&RopeScaling::original_max_position_embeddings), preset_name, path);
  check_key("beta_fast", f.beta_fast, r.beta_fast, field(&RopeScaling::beta_fast), preset_name,
            path);
  check_key("beta_slow", f.beta_slow, r.beta_slow, field(&RopeScaling::beta_slow), preset_name,
            path);
  check_key("attention_factor", f.attention_factor, r.attention_factor,
            field(&RopeScaling::attention_factor), preset_name, path, true);
  check_key("mscale", f.mscale, r.mscale, field(&RopeScaling::mscale), preset_name, path, true);
  check_key("mscale_all_dim", f.mscale_all_dim, r.mscale_all_dim,
            field(&RopeScaling::mscale_all_dim), preset_name, path, true);
  check_key("truncate", f.truncate, r.truncate, field(&RopeScaling::truncate), preset_name, path);
}

}  // namespace zrt
