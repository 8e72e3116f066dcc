// A parameter count as the model descriptions print it: "124.4M", "1557.6M"; below a million
// "117.5K", so that a tiny test model does not read "0.0M params".
#pragma once

#include <cstdint>
#include <string>

#include <fmt/format.h>

namespace zrt {

inline std::string param_count_text(std::int64_t count) {
  const auto n = static_cast<double>(count);
  return count < 1000000 ? fmt::format("{:.1f}K", n / 1e3) : fmt::format("{:.1f}M", n / 1e6);
}

}  // namespace zrt
