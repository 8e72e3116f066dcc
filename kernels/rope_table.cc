#include "kernels/rope_table.h"

#include <cmath>

#include "runtime/common/error.h"

namespace zrt::kernels {

RopeTable make_rope_table(int head_dim, double theta, const RopeScalingParams& scaling) {
  if (head_dim <= 0 || head_dim % 2 != 0 || head_dim / 2 > kRopeMaxPairs) {
    ZRT_THROW(InvalidArgument, "rope: head_dim={} must be even and at most {}", head_dim,
              2 * kRopeMaxPairs);
  }
  if (!(theta > 0)) ZRT_THROW(InvalidArgument, "rope: rope_theta={} must be positive", theta);
  const bool llama3 = scaling.rope_type == "llama3";
  if (!llama3 && scaling.rope_type != "default") {
    ZRT_THROW(InvalidArgument, "rope: rope_type '{}' is not supported (default, llama3)",
              scaling.rope_type);
  }
  if (llama3 &&
      (!(scaling.factor >= 1) || !(scaling.high_freq_factor > scaling.low_freq_factor) ||
       !(scaling.low_freq_factor > 0) || !(scaling.original_max_position_embeddings > 0))) {
    ZRT_THROW(InvalidArgument,
              "rope: llama3 scaling needs factor >= 1, 0 < low_freq_factor < high_freq_factor and "
              "original_max_position_embeddings > 0 (got factor={} low_freq_factor={} "
              "high_freq_factor={} original_max_position_embeddings={})",
              scaling.factor, scaling.low_freq_factor, scaling.high_freq_factor,
              scaling.original_max_position_embeddings);
  }
  RopeTable table;
  table.pairs = head_dim / 2;
  const double pi = std::acos(-1.0);
  for (int i = 0; i < table.pairs; ++i) {
    double f = 1.0 / std::pow(theta, static_cast<double>(2 * i) / head_dim);
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
    table.inv_freq[i] = static_cast<float>(f);
  }
  return table;
}

}  // namespace zrt::kernels
