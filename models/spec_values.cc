#include "models/spec_values.h"

#include <exception>

#include "runtime/common/error.h"

namespace zrt {

int spec_int(const char* family, const std::string& key, const std::string& value) {
  try {
    std::size_t used = 0;
    const long long v = std::stoll(value, &used);
    if (used == value.size() && v >= -2147483647LL && v <= 2147483647LL) {
      return static_cast<int>(v);
    }
  } catch (const std::exception&) {
  }
  ZRT_THROW(InvalidArgument, "{} config: {}={} is not an integer", family, key, value);
}

double spec_double(const char* family, const std::string& key, const std::string& value) {
  try {
    std::size_t used = 0;
    const double v = std::stod(value, &used);
    if (used == value.size()) return v;
  } catch (const std::exception&) {
  }
  ZRT_THROW(InvalidArgument, "{} config: {}={} is not a number", family, key, value);
}

bool spec_bool(const char* family, const std::string& key, const std::string& value) {
  if (value == "true" || value == "1") return true;
  if (value == "false" || value == "0") return false;
  ZRT_THROW(InvalidArgument, "{} config: {}={} is not true or false", family, key, value);
}

std::vector<std::pair<std::string, std::string>> spec_items(const char* family,
                                                            const std::string& items) {
  std::vector<std::pair<std::string, std::string>> out;
  std::size_t pos = 0;
  while (pos < items.size()) {
    std::size_t end = items.find(',', pos);
    if (end == std::string::npos) end = items.size();
    const std::string item = items.substr(pos, end - pos);
    pos = end + 1;
    if (item.empty()) continue;
    const std::size_t eq = item.find('=');
    if (eq == std::string::npos) {
      ZRT_THROW(InvalidArgument, "{} config: expected key=value, got '{}'", family, item);
    }
    out.emplace_back(item.substr(0, eq), item.substr(eq + 1));
  }
  return out;
}

}  // namespace zrt
