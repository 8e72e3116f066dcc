#include "train/monitors/csv_monitor.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>

#include <spdlog/fmt/fmt.h>

#include "runtime/common/error.h"
#include "train/history_file.h"

namespace zrt::train {

namespace fs = std::filesystem;

CsvMonitor::CsvMonitor(std::string dir, std::int64_t resumed_step)
    : dir_(std::move(dir)), resumed_step_(resumed_step) {}

std::string CsvMonitor::file_name(const std::string& name) {
  std::string file = name;
  for (char& c : file) {
    if (c == '/' || c == ' ') c = '_';
  }
  return file + ".csv";
}

std::string CsvMonitor::header(const std::string& name) {
  const std::size_t slash = name.rfind('/');
  return "step," + (slash == std::string::npos ? name : name.substr(slash + 1));
}

void CsvMonitor::write(const std::string& name, std::int64_t step, double value) {
  const std::string file = file_name(name);
  const fs::path path = fs::path(dir_) / file;
  if (prepared_.count(file) == 0) {
    std::error_code ec;
    fs::create_directories(dir_, ec);
    if (ec) ZRT_THROW(Error, "csv_monitor: cannot create {}: {}", dir_, ec.message());
    const std::string head = header(name);
    // The header stays; a row stays if its step is at most the resumed one.
    keep_history_lines(path.string(), [&](const std::string& line) {
      if (line == head) return true;
      const std::size_t comma = line.find(',');
      if (comma == std::string::npos || comma == 0) return false;
      try {
        std::size_t used = 0;
        const long long row_step = std::stoll(line.substr(0, comma), &used);
        return used == comma && row_step <= resumed_step_;
      } catch (const std::exception&) {
        return false;
      }
    });
    prepared_.insert(file);
  }
  std::error_code ec;
  const bool fresh = !fs::exists(path, ec) || fs::file_size(path, ec) == 0;
  std::ofstream out(path, std::ios::binary | std::ios::app);
  if (!out)
    ZRT_THROW(Error, "csv_monitor: cannot open {}: {}", path.string(), std::strerror(errno));
  if (fresh) out << header(name) << '\n';
  out << step << ',' << fmt::format("{}", value) << '\n';
  out.flush();
  if (!out)
    ZRT_THROW(Error, "csv_monitor: writing {} failed: {}", path.string(), std::strerror(errno));
}

}  // namespace zrt::train
