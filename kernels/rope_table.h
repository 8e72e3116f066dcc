// The rotary-embedding frequency table (RoPE), shared by the CPU and CUDA twins of kernels::rope_*.
//
// inv_freq[i] = theta^(-2i/head_dim) for i < head_dim/2, as transformers'
// _compute_default_rope_parameters; with rope_type "llama3" (Llama 3.1/3.2) each frequency is
// then rescaled as transformers' _compute_llama3_parameters does: wavelengths 2*pi/inv_freq
// longer than original_max_position_embeddings/low_freq_factor are divided by `factor`, those
// shorter than original_max_position_embeddings/high_freq_factor are kept, and the ones between
// are interpolated with smooth = (original/wavelen - low_freq_factor) /
// (high_freq_factor - low_freq_factor) as (1 - smooth) * f/factor + smooth * f.
//
// The table travels by value to the kernels (a CUDA kernel argument), so it has a fixed capacity:
// head_dim up to 2 * kRopeMaxPairs.
#pragma once

#include <string>

namespace zrt::kernels {

constexpr int kRopeMaxPairs = 256;

struct RopeScalingParams {
  std::string rope_type = "default";  // "default" or "llama3"
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double original_max_position_embeddings = 8192;
};

struct RopeTable {
  int pairs = 0;                       // head_dim / 2
  float inv_freq[kRopeMaxPairs] = {};  // rounded to fp32, as transformers keeps them
};

// Throws InvalidArgument for an odd or too large head_dim, theta <= 0, an unknown rope_type or
// llama3 factors that do not make sense (factor < 1, high_freq_factor <= low_freq_factor).
RopeTable make_rope_table(int head_dim, double theta, const RopeScalingParams& scaling);

}  // namespace zrt::kernels
