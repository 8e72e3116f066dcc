// The goldens of tests/golden/moe_golden.json (make_moe_golden.py: transformers' float64
// MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM): the file, each case's MoeConfig
// and the generator's weights (zrt's counter RNG keyed on the parameter's index in transformers'
// named_parameters() order, make_llama_golden.py's weight_values). Shared by test_moe and
// test_engine_moe.
#pragma once

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/moe/moe_config.h"
#include "runtime/common/error.h"
#include "tests/kernels/kernel_test_util.h"

namespace zrt::test {

inline const nlohmann::json& moe_golden() {
  static const nlohmann::json doc = [] {
    std::ifstream in(ZRT_MOE_MODEL_GOLDEN);
    ZRT_CHECK(in.good(), "cannot open {}", ZRT_MOE_MODEL_GOLDEN);
    return nlohmann::json::parse(in);
  }();
  return doc;
}

#ifdef ZRT_MOE_WINDOW_GOLDEN
// tests/golden/moe_window_golden.json (make_moe_window_golden.py): Mixtral and Qwen3-MoE with a
// 3-token sliding window, in moe_golden.json's form.
inline const nlohmann::json& moe_window_golden() {
  static const nlohmann::json doc = [] {
    std::ifstream in(ZRT_MOE_WINDOW_GOLDEN);
    ZRT_CHECK(in.good(), "cannot open {}", ZRT_MOE_WINDOW_GOLDEN);
    return nlohmann::json::parse(in);
  }();
  return doc;
}
#endif

inline moe::MoeConfig moe_case_config(const nlohmann::json& g) {
  const auto& d = g["dims"];
  moe::MoeConfig c;
  c.name = g["label"];
  c.architecture = g["architecture"];
  c.hidden_size = d["hidden_size"];
  c.intermediate_size = d["intermediate_size"];
  c.num_hidden_layers = d["num_hidden_layers"];
  c.num_attention_heads = d["num_attention_heads"];
  c.num_key_value_heads = d["num_key_value_heads"];
  c.head_dim = d["head_dim"];
  c.vocab_size = d["vocab_size"];
  c.max_position_embeddings = d["max_position_embeddings"];
  c.rms_norm_eps = d["rms_norm_eps"];
  c.rope_theta = d["rope_theta"];
  c.tie_word_embeddings = d["tie_word_embeddings"];
  c.num_experts = d["num_experts"];
  c.num_experts_per_tok = d["num_experts_per_tok"];
  c.norm_topk_prob = d["norm_topk_prob"];
  c.moe_intermediate_size = d.value("moe_intermediate_size", c.intermediate_size);
  c.shared_expert_intermediate_size = d.value("shared_expert_intermediate_size", 0);
  c.decoder_sparse_step = d.value("decoder_sparse_step", 1);
  c.mlp_only_layers = d.value("mlp_only_layers", std::vector<int>{});
  c.attention_bias = c.architecture == "qwen2_moe";
  c.sliding_window = d.value("sliding_window", 0);
  c.router_aux_loss_coef = g["router_aux_loss_coef"];
  c.seq_len = c.max_position_embeddings;
  return c;
}

// The seed of the generator's weights: make_moe_golden.py imports make_llama_golden.py's
// weight_values, which keys them on that module's SEED (the golden's "seed" keys the tokens).
constexpr std::uint64_t kMoeGoldenWeightSeed = 1601;

// The generator's value of parameter `name`, index `index` in its named_parameters().
inline std::vector<float> moe_golden_weights(const std::string& name, int index, std::int64_t n) {
  const std::uint64_t seed = kMoeGoldenWeightSeed;
  auto ends_with = [&](const std::string& s) {
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  std::vector<double> v;
  if (ends_with("norm.weight")) {
    v = normal_values(seed, index, n, 0.1, 1.0);
  } else if (ends_with(".bias")) {
    v = normal_values(seed, index, n, 0.1);
  } else {
    v = normal_values(seed, index, n, 0.2);
  }
  return cast_vector<float>(v);
}

// The golden's index of parameter `name` (its named_parameters() position).
inline int moe_golden_index(const nlohmann::json& g, const std::string& name) {
  const auto& names = g["names"];
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (names[i].get<std::string>() == name) return static_cast<int>(i);
  }
  ZRT_THROW(InvalidArgument, "golden {} has no parameter {}", g["label"].get<std::string>(), name);
}

}  // namespace zrt::test
