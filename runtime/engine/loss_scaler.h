// fp16 loss scaling with DeepSpeed's keys, defaults and state machine (DynamicLossScaler):
// on overflow the scale halves once `hysteresis` overflows have been absorbed; after
// `loss_scale_window` iterations since the last overflow it doubles. A static scale
// (loss_scale > 0) never changes. Every rank runs the same machine on the same all-reduced
// overflow flag, so scales agree everywhere.
#pragma once

#include <cstdint>

namespace zrt {

struct LossScaleOptions {
  double loss_scale = 0.0;  // 0: dynamic; > 0: static scale
  int initial_scale_power = 16;
  int loss_scale_window = 1000;
  int hysteresis = 2;
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1.0;
  double scale_factor = 2.0;
};

// The scaler's whole state (checkpointed).
struct LossScaleState {
  double scale = 1.0;
  std::int64_t iteration = 0;
  std::int64_t last_overflow_iteration = -1;
  int hysteresis_left = 1;
};

class LossScaler {
 public:
  explicit LossScaler(const LossScaleOptions& options);
  double scale() const { return state_.scale; }
  bool dynamic() const { return options_.loss_scale <= 0.0; }
  // Advances the state machine after a step whose gradients did (or did not) overflow.
  // Throws if an overflow happens with the scale already at min_loss_scale (DeepSpeed's
  // raise_error_at_min_scale): training cannot make progress.
  void update(bool overflow);
  const LossScaleState& state() const { return state_; }
  // A checkpoint's state. A static scale stays this scaler's own (the config's): a run resumed
  // with fp16.loss_scale set scales by it, whatever the saved scaler held (a dynamic one's
  // scale, or another static value); a dynamic scaler continues from the saved scale.
  void restore(const LossScaleState& state) {
    state_ = state;
    if (!dynamic()) state_.scale = options_.loss_scale;
  }

 private:
  LossScaleOptions options_;
  LossScaleState state_;
};

}  // namespace zrt
