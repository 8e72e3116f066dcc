// The goldens of tests/golden/llama_golden.json (make_llama_golden.py: transformers'
// LlamaForCausalLM and Qwen2ForCausalLM; qwen3_golden.json and llama_window_golden.json the same
// form): the file, each case's LlamaConfig, and the
// generator's weights (zrt's counter RNG keyed on the parameter index). Shared by test_llama.cc
// and the GPU parity test.
#pragma once

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
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

#ifdef ZRT_LLAMA_WINDOW_GOLDEN
// tests/golden/llama_window_golden.json (make_llama_window_golden.py): the same form, with sliding
// windows.
inline const nlohmann::json& llama_window_golden() {
  static const nlohmann::json doc = [] {
    std::ifstream in(ZRT_LLAMA_WINDOW_GOLDEN);
    ZRT_CHECK(in.good(), "cannot open {}", ZRT_LLAMA_WINDOW_GOLDEN);
    return nlohmann::json::parse(in);
  }();
  return doc;
}
#endif

#ifdef ZRT_QWEN3_GOLDEN
// tests/golden/qwen3_golden.json (make_qwen3_golden.py): the same form, transformers'
// Qwen3ForCausalLM.
inline const nlohmann::json& qwen3_golden() {
  static const nlohmann::json doc = [] {
    std::ifstream in(ZRT_QWEN3_GOLDEN);
    ZRT_CHECK(in.good(), "cannot open {}", ZRT_QWEN3_GOLDEN);
    return nlohmann::json::parse(in);
  }();
  return doc;
}
#endif

// config.json's rope_scaling (llama3, linear or yarn) as the model's, absent keys at their
// defaults.
inline llama::RopeScaling rope_scaling_of(const nlohmann::json& r) {
  llama::RopeScaling s;
  s.rope_type = r["rope_type"];
  s.factor = r.value("factor", s.factor);
  s.low_freq_factor = r.value("low_freq_factor", s.low_freq_factor);
  s.high_freq_factor = r.value("high_freq_factor", s.high_freq_factor);
  s.original_max_position_embeddings =
      r.value("original_max_position_embeddings", s.original_max_position_embeddings);
  s.attention_factor = r.value("attention_factor", s.attention_factor);
  s.beta_fast = r.value("beta_fast", s.beta_fast);
  s.beta_slow = r.value("beta_slow", s.beta_slow);
  s.mscale = r.value("mscale", s.mscale);
  s.mscale_all_dim = r.value("mscale_all_dim", s.mscale_all_dim);
  s.truncate = r.value("truncate", s.truncate);
  return s;
}

#ifdef ZRT_ROPE_SCALING_GOLDEN
// tests/golden/rope_scaling_golden.json (make_rope_scaling_golden.py): transformers' yarn and
// linear tables, and two models (the cases' form) that use them.
inline const nlohmann::json& rope_scaling_golden() {
  static const nlohmann::json doc = [] {
    std::ifstream in(ZRT_ROPE_SCALING_GOLDEN);
    ZRT_CHECK(in.good(), "cannot open {}", ZRT_ROPE_SCALING_GOLDEN);
    return nlohmann::json::parse(in);
  }();
  return doc;
}
#endif

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
  c.sliding_window = d.value("sliding_window", 0);
  c.max_window_layers = d.value("max_window_layers", 0);
  if (d.contains("rope_scaling")) c.rope_scaling = rope_scaling_of(d["rope_scaling"]);
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

// The golden batch's tokens and targets, with its two sequences swapped when `swap_sequences`
// (B = 2): the same loss and parameter gradients in exact arithmetic, the gradients' sums over
// the rows taken in another order in fp32.
inline std::pair<std::vector<std::int32_t>, std::vector<std::int32_t>> golden_batch(
    const nlohmann::json& g, bool swap_sequences) {
  auto tokens = g["tokens"].get<std::vector<std::int32_t>>();
  auto targets = g["targets"].get<std::vector<std::int32_t>>();
  if (swap_sequences) {
    const int B = g["B"], T = g["T"];
    ZRT_CHECK(B == 2, "swapping the sequences of a batch of {}", B);
    std::rotate(tokens.begin(), tokens.begin() + T, tokens.end());
    std::rotate(targets.begin(), targets.begin() + T, targets.end());
  }
  return {tokens, targets};
}

// The tolerance of a gradient computed in fp32 against the float64 golden, two terms:
//  - the chain: an element of a gradient is the end of about ten products back from the loss
//    (head, final norm, each block's MLP and attention), each of inner length at most 48 (the
//    widest dimension of these models), whose first-order worst case (Higham, Accuracy and
//    Stability, 3.1) adds up to 10 x 48 u = 2.9e-5 (u = 2^-24): 3e-5, whatever the BLAS's kernels
//    (with or without FMA, in any order; measured worst: 3.7e-6 with OpenBLAS's SkylakeX kernels,
//    6.4e-6 Zen's, 1.1e-5 its generic Prescott ones, all on a Qwen2 key bias's gradient);
//  - the sum over the rows: a weight's or bias's gradient adds the B x T rows' terms, so its
//    relative error grows with their cancellation, sum|t_i| / |sum t_i|, which differs per tensor.
//    Two fp32 orders of the same sums (the batch as given, and its sequences swapped) each differ
//    from the exact one by rounding of that size, so their distance measures it: 4 times that
//    distance (two draws of one rounding land within a small factor of each other; the engine's
//    parity tests use the same factor).
inline double gradient_tolerance(const std::vector<float>& grad,
                                 const std::vector<float>& swapped_grad) {
  constexpr double kChain = 3e-5;
  return std::max(kChain, 4.0 * rel_error(swapped_grad, grad));
}

}  // namespace zrt::test
