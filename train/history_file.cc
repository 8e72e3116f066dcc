#include "train/history_file.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>
#include <vector>

#include "runtime/common/error.h"

namespace zrt::train {

HistoryTrim keep_history_lines(const std::string& path,
                               const std::function<bool(const std::string& line)>& keep) {
  HistoryTrim trim;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return trim;
  std::ifstream in(path, std::ios::binary);
  if (!in) ZRT_THROW(Error, "{}: cannot read: {}", path, std::strerror(errno));
  std::vector<std::string> kept;
  std::string line;
  while (std::getline(in, line)) {
    if (keep(line)) {
      kept.push_back(line);
    } else {
      ++trim.dropped;
    }
  }
  if (in.bad()) ZRT_THROW(Error, "{}: read failed: {}", path, std::strerror(errno));
  trim.kept = static_cast<std::int64_t>(kept.size());
  if (trim.dropped == 0) return trim;
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) ZRT_THROW(Error, "{}: cannot write: {}", tmp, std::strerror(errno));
    for (const std::string& row : kept) out << row << '\n';
    out.flush();
    if (!out) ZRT_THROW(Error, "{}: write failed: {}", tmp, std::strerror(errno));
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) ZRT_THROW(Error, "{}: cannot replace it with {}: {}", path, tmp, ec.message());
  return trim;
}

}  // namespace zrt::train
