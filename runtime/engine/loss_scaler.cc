#include "runtime/engine/loss_scaler.h"

#include <algorithm>
#include <cmath>

#include "runtime/common/error.h"

namespace zrt {

LossScaler::LossScaler(const LossScaleOptions& options) : options_(options) {
  ZRT_CHECK(options.loss_scale_window >= 1, "loss_scale_window must be >= 1, got {}",
            options.loss_scale_window);
  ZRT_CHECK(options.hysteresis >= 1, "hysteresis must be >= 1, got {}", options.hysteresis);
  ZRT_CHECK(options.min_loss_scale > 0.0, "min_loss_scale must be > 0, got {}",
            options.min_loss_scale);
  state_.scale = dynamic() ? std::ldexp(1.0, options.initial_scale_power) : options.loss_scale;
  state_.hysteresis_left = options.hysteresis;
}

void LossScaler::update(bool overflow) {
  if (!dynamic()) {
    ++state_.iteration;
    return;
  }
  if (overflow) {
    if (options_.hysteresis == 1 || state_.hysteresis_left == 1) {
      if (state_.scale <= options_.min_loss_scale) {
        ZRT_THROW(Error,
                  "fp16 gradients overflowed with the loss scale already at min_loss_scale "
                  "({}); training cannot progress (check the learning rate and the data, or "
                  "use bf16)",
                  options_.min_loss_scale);
      }
      state_.scale = std::max(state_.scale / options_.scale_factor, options_.min_loss_scale);
    } else {
      --state_.hysteresis_left;
    }
    state_.last_overflow_iteration = state_.iteration;
  } else {
    if (options_.consecutive_hysteresis) state_.hysteresis_left = options_.hysteresis;
    if ((state_.iteration - state_.last_overflow_iteration) % options_.loss_scale_window == 0) {
      if (!options_.consecutive_hysteresis) state_.hysteresis_left = options_.hysteresis;
      state_.scale *= options_.scale_factor;
    }
  }
  ++state_.iteration;
}

}  // namespace zrt
