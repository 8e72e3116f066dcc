#include "optimizers/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "runtime/common/error.h"

namespace zrt {

namespace {
constexpr double kPi = 3.14159265358979323846;
}

LrSchedule::LrSchedule(const SchedulerConfig& config, double optimizer_lr)
    : config_(config),
      optimizer_lr_(optimizer_lr),
      warmup_steps_(std::max<std::int64_t>(2, config.warmup_num_steps)),
      inverse_log_warmup_(1.0 / std::log(static_cast<double>(warmup_steps_))) {}

double LrSchedule::warmup_gamma(std::int64_t iteration) const {
  if (config_.warmup_type == WarmupType::kLog) {
    return inverse_log_warmup_ * std::log(static_cast<double>(iteration + 1));
  }
  return static_cast<double>(iteration) / static_cast<double>(warmup_steps_);
}

double LrSchedule::lr_at(std::int64_t iteration) const {
  ZRT_CHECK(iteration >= -1, "lr schedule iteration {} < -1", iteration);
  const SchedulerConfig& c = config_;
  switch (c.type) {
    case LrScheduleType::kConstant:
      return optimizer_lr_;

    case LrScheduleType::kWarmupLR:
    case LrScheduleType::kWarmupDecayLR: {
      if (iteration < 0) return c.warmup_min_lr;
      double gamma = 1.0;
      if (iteration < warmup_steps_) {
        gamma = warmup_gamma(iteration);
      } else if (c.type == LrScheduleType::kWarmupDecayLR) {
        gamma = std::max(0.0,
                         static_cast<double>(c.total_num_steps - iteration) /
                             std::max(1.0, static_cast<double>(c.total_num_steps - warmup_steps_)));
      }
      return c.warmup_min_lr + (c.warmup_max_lr - c.warmup_min_lr) * gamma;
    }

    case LrScheduleType::kWarmupCosineLR: {
      if (iteration < 0) return 0.0;
      double ratio;
      if (iteration < warmup_steps_) {
        ratio = c.warmup_min_ratio + warmup_gamma(iteration) * (1.0 - c.warmup_min_ratio);
      } else {
        // DeepSpeed's formula; past total_num_steps it would rise again along the cosine, so the
        // position is clamped there and the lr stays at cos_min_ratio * lr.
        const std::int64_t total = c.total_num_steps - warmup_steps_;
        const std::int64_t position = std::min(iteration - warmup_steps_ + 1, total);
        const double cosine =
            (1.0 + std::cos(kPi * static_cast<double>(position) / static_cast<double>(total))) /
            2.0;
        ratio = std::max(0.0, c.cos_min_ratio + (1.0 - c.cos_min_ratio) * cosine);
      }
      return optimizer_lr_ * ratio;
    }
  }
  return optimizer_lr_;
}

}  // namespace zrt
