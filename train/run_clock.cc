#include "train/run_clock.h"

#include <cmath>

#include <spdlog/fmt/fmt.h>

namespace zrt::train {

std::string format_duration(double seconds) {
  if (!(seconds > 0)) return "0s";  // also NaN
  const auto s = static_cast<std::int64_t>(std::llround(seconds));
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}m{:02}s", s / 60, s % 60);
  if (s < 86400) return fmt::format("{}h{:02}m", s / 3600, s % 3600 / 60);
  return fmt::format("{}d{:02}h", s / 86400, s % 86400 / 3600);
}

double eta_seconds(double elapsed_s, std::int64_t steps_done, std::int64_t steps_left) {
  if (steps_done <= 0 || steps_left <= 0) return 0.0;
  return elapsed_s / static_cast<double>(steps_done) * static_cast<double>(steps_left);
}

}  // namespace zrt::train
