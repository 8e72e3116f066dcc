// zrt-mem's printed report: the chosen setting by category (per-rank device, per-node host), the
// table of every setting, and the verdict. Separate from the CLI so tests can read the text.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tools/mem/memory_estimate.h"

namespace zrt::mem {

// "31.4" : decimal gigabytes (10^9 bytes, as the ZeRO paper counts) with one decimal.
std::string gb(std::int64_t bytes);

// The whole report. `chosen` is the setting printed by category (the verdict's choice when the
// user gave no stage). `estimates` covers table_order().
std::string format_report(const Inputs& in, const Estimate& chosen,
                          const std::vector<Estimate>& estimates);

// The verdict line: "verdict: stage 2 fits ..." or "verdict: no setting fits ...".
std::string format_verdict(const Inputs& in, const std::vector<Estimate>& estimates);

}  // namespace zrt::mem
