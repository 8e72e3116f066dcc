// The rotary-embedding frequency table (RoPE), shared by the CPU and CUDA twins of kernels::rope_*.
//
// inv_freq[i] = theta^(-2i/head_dim) for i < head_dim/2, as transformers'
// _compute_default_rope_parameters, then rescaled by the rope_type (transformers'
// modeling_rope_utils, each function named after it):
//  - "linear" (_compute_linear_scaling_rope_parameters): every frequency divided by `factor`;
//  - "llama3" (Llama 3.1/3.2, _compute_llama3_parameters): wavelengths 2*pi/inv_freq longer than
//    original_max_position_embeddings/low_freq_factor are divided by `factor`, those shorter than
//    original_max_position_embeddings/high_freq_factor are kept, and the ones between are
//    interpolated with smooth = (original/wavelen - low_freq_factor) /
//    (high_freq_factor - low_freq_factor) as (1 - smooth) * f/factor + smooth * f;
//  - "yarn" (YaRN, _compute_yarn_parameters; Qwen2.5 / Qwen3 past 32K tokens, DeepSeek): with
//    d(r) = head_dim * ln(original / (r * 2 pi)) / (2 ln theta), the dimension that turns r times
//    over the original context, low = d(beta_fast) and high = d(beta_slow) (floored and ceiled
//    unless truncate is false, then clamped to [0, head_dim - 1]), and ramp(i) = clamp((i - low)
//    / (high - low), 0, 1): inv_freq[i] = f/factor * ramp + f * (1 - ramp), the fast dimensions
//    kept, the slow ones interpolated. Its attention factor (attention_factor, else
//    mscale(factor, mscale) / mscale(factor, mscale_all_dim) when both are given, else
//    mscale(factor, 1), with mscale(s, m) = 0.1 m ln(s) + 1 for s > 1, else 1) scales the cosine
//    and the sine, so q.k grows by its square.
//
// The table travels by value to the kernels (a CUDA kernel argument), so it has a fixed capacity:
// head_dim up to 2 * kRopeMaxPairs.
#pragma once

#include <string>

namespace zrt::kernels {

constexpr int kRopeMaxPairs = 256;
// YaRN's beta_fast and beta_slow where config.json has none (transformers' `or 32`, `or 1`).
constexpr double kYarnBetaFast = 32, kYarnBetaSlow = 1;

struct RopeScalingParams {
  std::string rope_type = "default";  // "default", "linear", "llama3" or "yarn"
  double factor = 1.0;
  double low_freq_factor = 1.0;                    // llama3
  double high_freq_factor = 4.0;                   // llama3
  double original_max_position_embeddings = 8192;  // llama3, yarn
  // yarn (config.json's names; 0 where the key is absent: its default or derived value).
  double attention_factor = 0;  // 0: from factor and mscale / mscale_all_dim
  double beta_fast = 0;         // 0: kYarnBetaFast
  double beta_slow = 0;         // 0: kYarnBetaSlow
  double mscale = 0, mscale_all_dim = 0;
  bool truncate = true;
};

struct RopeTable {
  int pairs = 0;                       // head_dim / 2
  float inv_freq[kRopeMaxPairs] = {};  // rounded to fp32, as transformers keeps them
  // yarn's attention factor (transformers' attention_scaling): the rotation's cosine and sine are
  // multiplied by it; 1 for every other rope_type.
  float attention_scaling = 1.0f;
};

// yarn's attention factor of `scaling` (the formula above), whatever its rope_type asks.
double yarn_attention_factor(const RopeScalingParams& scaling);

// Throws InvalidArgument for an odd or too large head_dim, theta <= 0, an unknown rope_type or
// factors that do not make sense (factor < 1; llama3: high_freq_factor <= low_freq_factor; yarn:
// beta_fast < beta_slow, a negative attention_factor, beta or mscale).
RopeTable make_rope_table(int head_dim, double theta, const RopeScalingParams& scaling);

}  // namespace zrt::kernels
