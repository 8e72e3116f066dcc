#include "runtime/device/memory_tracker.h"

#include <algorithm>

#include "runtime/common/error.h"

namespace zrt {

std::string format_bytes(std::int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes >= (std::int64_t{1} << 30)) return fmt::format("{:.2f} GiB", b / (1 << 30));
  if (bytes >= (std::int64_t{1} << 20)) return fmt::format("{:.2f} MiB", b / (1 << 20));
  if (bytes >= (std::int64_t{1} << 10)) return fmt::format("{:.2f} KiB", b / (1 << 10));
  return fmt::format("{} B", bytes);
}

MemoryTracker::MemoryTracker(std::int64_t device_capacity_bytes)
    : capacity_(device_capacity_bytes) {
  ZRT_CHECK(device_capacity_bytes >= 0, "negative memory capacity {}", device_capacity_bytes);
}

void MemoryTracker::on_allocate(MemorySpace space, MemCategory category, std::int64_t bytes,
                                const std::string& label) {
  ZRT_CHECK(bytes >= 0, "negative allocation of {} bytes for '{}'", bytes, label);
  std::lock_guard<std::mutex> lock(mutex_);
  MemoryUsage& u = usage_[static_cast<std::size_t>(space)];
  if (space == MemorySpace::kDevice && capacity_ > 0 && u.total_current + bytes > capacity_) {
    throw OutOfMemory(
        __FILE__, __LINE__,
        fmt::format("out of memory: '{}' asked for {} of {} ({}) but only {} of {} is free; {}",
                    label, format_bytes(bytes), mem_category_name(category),
                    memory_space_name(space), format_bytes(capacity_ - u.total_current),
                    format_bytes(capacity_), report_locked(space)));
  }
  const auto c = static_cast<std::size_t>(category);
  u.current[c] += bytes;
  u.peak[c] = std::max(u.peak[c], u.current[c]);
  u.total_current += bytes;
  u.total_peak = std::max(u.total_peak, u.total_current);
  if (is_model_state(category)) {
    u.model_state_current += bytes;
    u.model_state_peak = std::max(u.model_state_peak, u.model_state_current);
  }
}

void MemoryTracker::on_free(MemorySpace space, MemCategory category, std::int64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  MemoryUsage& u = usage_[static_cast<std::size_t>(space)];
  u.current[static_cast<std::size_t>(category)] -= bytes;
  u.total_current -= bytes;
  if (is_model_state(category)) u.model_state_current -= bytes;
}

void MemoryTracker::throw_out_of_memory(MemorySpace space, MemCategory category, std::int64_t bytes,
                                        const std::string& label, const std::string& reason) const {
  std::lock_guard<std::mutex> lock(mutex_);
  throw OutOfMemory(__FILE__, __LINE__,
                    fmt::format("out of memory: '{}' asked for {} of {} ({}): {}; {}", label,
                                format_bytes(bytes), mem_category_name(category),
                                memory_space_name(space), reason, report_locked(space)));
}

MemoryUsage MemoryTracker::usage(MemorySpace space) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return usage_[static_cast<std::size_t>(space)];
}

void MemoryTracker::reset_peaks() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (MemoryUsage& u : usage_) {
    u.peak = u.current;
    u.total_peak = u.total_current;
    u.model_state_peak = u.model_state_current;
  }
}

std::string MemoryTracker::report(MemorySpace space) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return report_locked(space);
}

std::string MemoryTracker::report_locked(MemorySpace space) const {
  const MemoryUsage& u = usage_[static_cast<std::size_t>(space)];
  std::string out = fmt::format("{}: {} in use (peak {})", memory_space_name(space),
                                format_bytes(u.total_current), format_bytes(u.total_peak));
  if (space == MemorySpace::kDevice && capacity_ > 0) {
    out += fmt::format(" of {}", format_bytes(capacity_));
  }
  out += "; by category (current / peak):";
  for (std::size_t c = 0; c < kNumMemCategories; ++c) {
    out += fmt::format(" {} {} / {}{}", mem_category_name(static_cast<MemCategory>(c)),
                       format_bytes(u.current[c]), format_bytes(u.peak[c]),
                       c + 1 < kNumMemCategories ? "," : "");
  }
  return out;
}

}  // namespace zrt
