// Learning-rate schedules with DeepSpeed's formulas and step indexing (deepspeed/runtime/
// lr_schedules.py): WarmupLR, WarmupDecayLR, WarmupCosineLR, or a constant lr.
//
// Indexing. DeepSpeed's schedulers carry `last_batch_iteration`, -1 at construction, and the
// engine calls scheduler.step() (incrementing it) after every *applied* optimizer step, so
// optimizer step k (1-based; skipped fp16-overflow steps do not count) runs with the lr of
// iteration k-2: steps 1 and 2 both use the warmup's first value. lr_for_step() encodes that,
// lr_at() exposes the raw per-iteration value.
//
// Thread-safety: immutable after construction.
#pragma once

#include <cstdint>

#include "optimizers/optimizer_config.h"

namespace zrt {

class LrSchedule {
 public:
  // optimizer_lr is the optimizer's "lr": the constant lr, and WarmupCosineLR's base lr
  // (WarmupLR and WarmupDecayLR ignore it, as in DeepSpeed).
  LrSchedule(const SchedulerConfig& config, double optimizer_lr);

  // DeepSpeed's get_lr() when last_batch_iteration == iteration (>= -1). Before the first
  // scheduler step (iteration -1) that is warmup_min_lr for WarmupLR/WarmupDecayLR and 0 for
  // WarmupCosineLR, as DeepSpeed sets at construction.
  double lr_at(std::int64_t iteration) const;

  // The lr of optimizer step `step` (1-based count of applied steps): lr_at(step - 2).
  double lr_for_step(std::int64_t step) const { return lr_at(step - 2); }

  const SchedulerConfig& config() const { return config_; }

 private:
  double warmup_gamma(std::int64_t iteration) const;  // 0 -> 1 over the warmup

  SchedulerConfig config_;
  double optimizer_lr_;
  std::int64_t warmup_steps_;  // max(2, warmup_num_steps), as DeepSpeed
  double inverse_log_warmup_;  // 1 / ln(warmup_steps_)
};

}  // namespace zrt
