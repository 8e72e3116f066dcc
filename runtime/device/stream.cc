#include "runtime/device/stream.h"

#include <spdlog/spdlog.h>

namespace zrt {

void drain_each(const std::vector<std::function<void()>>& drains) {
  std::exception_ptr first;
  for (const auto& drain : drains) {
    try {
      drain();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

DrainOnUnwind::~DrainOnUnwind() {
  if (std::uncaught_exceptions() <= exceptions_) return;  // left normally: the owner waits
  try {
    stream_.synchronize();
  } catch (const std::exception& e) {
    spdlog::debug("stream '{}' drained after an error: {}", stream_.name(), e.what());
  }
}

}  // namespace zrt
