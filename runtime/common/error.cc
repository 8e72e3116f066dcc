#include "runtime/common/error.h"

namespace zrt {

namespace {
// Paths are reported relative to the source tree, so messages do not depend on the checkout.
const char* short_path(const char* file) {
  const std::string_view path(file);
  // Matched in this order: tests/ before config/ and train/, which are also its subfolders.
  for (const char* root : {"runtime/", "optimizers/", "kernels/", "models/", "offload/", "tools/",
                           "tests/", "config/", "train/"}) {
    const auto pos = path.rfind(root);
    if (pos != std::string_view::npos) return file + pos;
  }
  return file;
}
}  // namespace

Error::Error(const char* file, int line, const std::string& message)
    : std::runtime_error(fmt::format("{}:{}: {}", short_path(file), line, message)),
      message_(message) {}

std::string error_text(const std::exception& e) {
  if (dynamic_cast<const InternalError*>(&e) != nullptr) return e.what();
  if (const auto* error = dynamic_cast<const Error*>(&e)) return error->message();
  return e.what();
}

namespace detail {
void throw_error(const char* file, int line, const std::string& message) {
  throw InternalError(file, line, message);
}
}  // namespace detail

}  // namespace zrt
