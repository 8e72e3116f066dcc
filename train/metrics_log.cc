#include "train/metrics_log.h"

#include <cerrno>
#include <cstring>

#include "runtime/common/error.h"

namespace zrt::train {

MetricsLog::MetricsLog(const std::string& path, std::int64_t resumed_step) : path_(path) {
  trimmed_ = keep_history_lines(path, [&](const std::string& line) {
    const auto row = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!row.is_object()) return false;
    const auto step = row.find("step");
    return step != row.end() && step->is_number_integer() &&
           step->get<std::int64_t>() <= resumed_step;
  });
  // A last row cut just before its newline still parses; the next row must not join it.
  bool needs_newline = false;
  if (std::ifstream last(path, std::ios::binary | std::ios::ate); last && last.tellg() > 0) {
    last.seekg(-1, std::ios::end);
    needs_newline = last.get() != '\n';
  }
  out_.open(path, std::ios::binary | std::ios::app);
  if (!out_) ZRT_THROW(Error, "{}: cannot open for appending: {}", path, std::strerror(errno));
  if (needs_newline) out_ << '\n';
}

void MetricsLog::append(const nlohmann::json& row) {
  out_ << row.dump() << '\n' << std::flush;
  if (!out_) ZRT_THROW(Error, "{}: write failed: {}", path_, std::strerror(errno));
}

}  // namespace zrt::train
