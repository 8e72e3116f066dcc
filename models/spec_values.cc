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

}  // namespace zrt
