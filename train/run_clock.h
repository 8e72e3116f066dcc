// Elapsed time and ETA for the step log line: "elapsed 3m05s | ETA 12m40s". The ETA is the
// steps left times the mean step time of this run so far (evaluations included), so it settles
// after a few logged steps and is not thrown off by the previous run of a resumed training.
#pragma once

#include <cstdint>
#include <string>

namespace zrt::train {

// "0s", "45s", "3m05s", "2h07m", "3d04h": two units at most, the larger first.
std::string format_duration(double seconds);

// steps_left x (elapsed_s / steps_done); 0 when no step is done yet.
double eta_seconds(double elapsed_s, std::int64_t steps_done, std::int64_t steps_left);

}  // namespace zrt::train
