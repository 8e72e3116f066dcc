#include "runtime/data/data_fingerprint.h"

#include <cstdint>
#include <fstream>
#include <map>
#include <sstream>

#include <spdlog/fmt/fmt.h>

#include "runtime/common/error.h"
#include "runtime/common/fnv1a.h"
#include "runtime/data/token_shard.h"

namespace zrt {

namespace {

constexpr std::int64_t kEndBytes = 64 * 1024;  // hashed at each end of a file

std::string file_name(const std::string& path) {
  const std::size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// "<name> <bytes> <hash>" of one file.
std::string file_entry(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) ZRT_THROW(DataError, "{}: cannot open to fingerprint the data", path);
  const std::int64_t size = static_cast<std::int64_t>(in.tellg());
  std::uint64_t hash = kFnv1aOffsetBasis;
  auto hash_range = [&](std::int64_t first, std::int64_t count) {
    std::string bytes(static_cast<std::size_t>(count), '\0');
    in.seekg(first);
    in.read(bytes.data(), count);
    if (!in)
      ZRT_THROW(DataError, "{}: cannot read {} bytes at {} to fingerprint", path, count, first);
    hash = fnv1a(hash, bytes.data(), bytes.size());
  };
  if (size <= 2 * kEndBytes) {
    hash_range(0, size);
  } else {
    hash_range(0, kEndBytes);
    hash_range(size - kEndBytes, kEndBytes);
  }
  return fmt::format("{} {} {:016x}", file_name(path), size, hash);
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) lines.push_back(line);
  }
  return lines;
}

struct Entry {
  std::string name, size, hash;
};
Entry parse(const std::string& line) {
  std::istringstream in(line);
  Entry e;
  in >> e.name >> e.size >> e.hash;
  return e;
}

}  // namespace

std::string data_fingerprint(const std::vector<std::string>& paths) {
  std::string text;
  for (const std::string& path : paths) {
    if (!text.empty()) text += '\n';
    text += file_entry(path);
  }
  return text;
}

std::string describe_fingerprint_change(const std::string& saved, const std::string& now) {
  if (saved == now) return "";
  const std::vector<std::string> before = lines_of(saved), after = lines_of(now);
  std::map<std::string, Entry> was;
  for (const std::string& line : before) {
    const Entry e = parse(line);
    was[e.name] = e;
  }
  std::map<std::string, Entry> is;
  for (const std::string& line : after) {
    const Entry e = parse(line);
    is[e.name] = e;
  }
  for (const auto& [name, e] : is) {
    const auto it = was.find(name);
    if (it == was.end()) return fmt::format("{} was not among the files then", name);
    if (it->second.size != e.size) {
      return fmt::format("{} holds {} bytes, {} then", name, e.size, it->second.size);
    }
    if (it->second.hash != e.hash) return fmt::format("{} has other contents (same size)", name);
  }
  for (const auto& [name, e] : was) {
    if (is.find(name) == is.end()) return fmt::format("{} is gone", name);
  }
  return "the files are the same but in another order";
}

}  // namespace zrt
