#include "kernels/rope_table.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "runtime/common/error.h"

namespace zrt::kernels {

double yarn_attention_factor(const RopeScalingParams& s) {
  if (s.attention_factor > 0) return s.attention_factor;
  const auto mscale = [&](double m) {
    return s.factor <= 1 ? 1.0 : 0.1 * m * std::log(s.factor) + 1;
  };
  if (s.mscale != 0 && s.mscale_all_dim != 0) return mscale(s.mscale) / mscale(s.mscale_all_dim);
  return mscale(1.0);
}

RopeTable make_rope_table(int head_dim, double theta, const RopeScalingParams& scaling) {
  if (head_dim <= 0 || head_dim % 2 != 0 || head_dim / 2 > kRopeMaxPairs) {
    ZRT_THROW(InvalidArgument, "rope: head_dim={} must be even and at most {}", head_dim,
              2 * kRopeMaxPairs);
  }
  if (!(theta > 0)) ZRT_THROW(InvalidArgument, "rope: rope_theta={} must be positive", theta);
  const std::string& type = scaling.rope_type;
  const bool llama3 = type == "llama3", yarn = type == "yarn", linear = type == "linear";
  if (!llama3 && !yarn && !linear && type != "default") {
    ZRT_THROW(InvalidArgument,
              "rope: rope_type '{}' is not supported (default, linear, llama3, yarn)", type);
  }
  if (type != "default" && !(scaling.factor >= 1)) {
    ZRT_THROW(InvalidArgument, "rope: {} scaling needs factor >= 1 (got factor={})", type,
              scaling.factor);
  }
  if (llama3 &&
      (!(scaling.high_freq_factor > scaling.low_freq_factor) || !(scaling.low_freq_factor > 0) ||
       !(scaling.original_max_position_embeddings > 0))) {
    ZRT_THROW(InvalidArgument,
              "rope: llama3 scaling needs factor >= 1, 0 < low_freq_factor < high_freq_factor and "
              "original_max_position_embeddings > 0 (got factor={} low_freq_factor={} "
              "high_freq_factor={} original_max_position_embeddings={})",
              scaling.factor, scaling.low_freq_factor, scaling.high_freq_factor,
              scaling.original_max_position_embeddings);
  }
  // transformers reads an absent (or zero) beta as its default: `beta_fast or 32`.
  const double beta_fast = scaling.beta_fast != 0 ? scaling.beta_fast : kYarnBetaFast;
  const double beta_slow = scaling.beta_slow != 0 ? scaling.beta_slow : kYarnBetaSlow;
  if (yarn && (!(scaling.original_max_position_embeddings > 0) || !(beta_slow > 0) ||
               !(beta_fast >= beta_slow) || !(scaling.attention_factor >= 0) ||
               !(scaling.mscale >= 0) || !(scaling.mscale_all_dim >= 0))) {
    ZRT_THROW(InvalidArgument,
              "rope: yarn scaling needs original_max_position_embeddings > 0, beta_fast >= "
              "beta_slow > 0 and attention_factor, mscale, mscale_all_dim >= 0 (got "
              "original_max_position_embeddings={} beta_fast={} beta_slow={} "
              "attention_factor={} mscale={} mscale_all_dim={})",
              scaling.original_max_position_embeddings, beta_fast, beta_slow,
              scaling.attention_factor, scaling.mscale, scaling.mscale_all_dim);
  }
  RopeTable table;
  table.pairs = head_dim / 2;
  const double pi = std::acos(-1.0);
  // yarn's ramp between the dimensions kept (below low) and those interpolated (above high).
  double low = 0, high = 0;
  if (yarn) {
    const double original = scaling.original_max_position_embeddings;
    const auto correction_dim = [&](double rotations) {
      return head_dim * std::log(original / (rotations * 2 * pi)) / (2 * std::log(theta));
    };
    low = correction_dim(beta_fast);
    high = correction_dim(beta_slow);
    if (scaling.truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(head_dim - 1));
    if (low == high) high += 0.001;  // transformers' guard against a zero-width ramp
    table.attention_scaling = static_cast<float>(yarn_attention_factor(scaling));
  }
  for (int i = 0; i < table.pairs; ++i) {
    double f = 1.0 / std::pow(theta, static_cast<double>(2 * i) / head_dim);
    if (linear) f /= scaling.factor;
    if (llama3) {
      const double old_len = scaling.original_max_position_embeddings;
      const double low_freq_wavelen = old_len / scaling.low_freq_factor;
      const double high_freq_wavelen = old_len / scaling.high_freq_factor;
      const double wavelen = 2 * pi / f;
      if (wavelen > low_freq_wavelen) {
        f /= scaling.factor;
      } else if (!(wavelen < high_freq_wavelen)) {
        const double smooth = (old_len / wavelen - scaling.low_freq_factor) /
                              (scaling.high_freq_factor - scaling.low_freq_factor);
        f = (1 - smooth) * f / scaling.factor + smooth * f;
      }
    }
    if (yarn) {
      const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
      f = f / scaling.factor * ramp + f * (1 - ramp);
    }
    table.inv_freq[i] = static_cast<float>(f);
  }
  return table;
}

}  // namespace zrt::kernels
