// The goldens of tests/golden/llama_golden.json (make_llama_golden.py: transformers'
// LlamaForCausalLM and Qwen2ForCausalLM): the file, each case's LlamaConfig, and the
// generator's weights (zrt's counter RNG keyed on the parameter index). Shared by test_llama.cc
// and the GPU parity test.
#pragma once

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/llama/llama_config.h"
#include "runtime/common/error.h"
#include "tests/kernels/kernel_test_util.h"

namespace zrt::test {

inline const nlohmann::json& llama_golden() {
  static const nlohmann::json doc = [] {
    std::ifstream in(ZRT_LLAMA_GOLDEN);
    ZRT_CHECK(in.good(), "cannot open {}", ZRT_LLAMA_GOLDEN);
    return nlohmann::json::parse(in);
  }();
  return doc;
}

inline llama::LlamaConfig case_config(const nlohmann::json& g) {
  const auto& d = g["dims"];
  llama::LlamaConfig c;
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
  c.attention_bias = d["attention_bias"];
  if (d.contains("rope_scaling")) {
    const auto& r = d["rope_scaling"];
    c.rope_scaling.rope_type = r["rope_type"];
    c.rope_scaling.factor = r["factor"];
    c.rope_scaling.low_freq_factor = r["low_freq_factor"];
    c.rope_scaling.high_freq_factor = r["high_freq_factor"];
    c.rope_scaling.original_max_position_embeddings = r["original_max_position_embeddings"];
  }
  c.seq_len = c.max_position_embeddings;
  return c;
}

// The generator's weights (make_llama_golden.py weight_values).
inline std::vector<float> golden_weights(const std::string& name, int index, std::int64_t n,
                                         std::uint64_t seed) {
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

}  // namespace zrt::test
