// MemoryTracker: current and peak bytes per (space, category), with an optional capacity on
// device memory. Thread-safe.
//
// A capacity makes a CPU rank behave like a GPU of that size: an allocation that would exceed
// it throws OutOfMemory naming the request and the full per-category breakdown, before any
// memory is taken.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

#include "runtime/device/memory.h"

namespace zrt {

struct MemoryUsage {
  std::array<std::int64_t, kNumMemCategories> current{};
  std::array<std::int64_t, kNumMemCategories> peak{};  // per-category peaks (not simultaneous)
  std::int64_t total_current = 0;
  std::int64_t total_peak = 0;  // peak of the sum
  // Model state as the ZeRO paper counts it: params + grads + master + optimizer.
  std::int64_t model_state_current = 0;
  std::int64_t model_state_peak = 0;
};

// True for the categories that make up model state (params, grads, master, optimizer).
constexpr bool is_model_state(MemCategory c) {
  return c == MemCategory::kParams || c == MemCategory::kGrads || c == MemCategory::kMaster ||
         c == MemCategory::kOptimizer;
}

class MemoryTracker {
 public:
  // capacity_bytes applies to MemorySpace::kDevice; 0 means unlimited.
  explicit MemoryTracker(std::int64_t device_capacity_bytes = 0);
  MemoryTracker(const MemoryTracker&) = delete;
  MemoryTracker& operator=(const MemoryTracker&) = delete;

  // Records an allocation; throws OutOfMemory (and records nothing) if a device allocation
  // would exceed the capacity. label names the request in the error ("unit 3 grad bucket").
  void on_allocate(MemorySpace space, MemCategory category, std::int64_t bytes,
                   const std::string& label);
  void on_free(MemorySpace space, MemCategory category, std::int64_t bytes);

  // Throws OutOfMemory with the same text as a capacity overflow; backends call it when the
  // real allocator fails (cudaMallocAsync returning an error).
  [[noreturn]] void throw_out_of_memory(MemorySpace space, MemCategory category, std::int64_t bytes,
                                        const std::string& label, const std::string& reason) const;

  MemoryUsage usage(MemorySpace space) const;
  std::int64_t capacity() const { return capacity_; }
  // Forgets peaks (sets them to current), e.g. after warm-up.
  void reset_peaks();
  // "device: 1.50 GiB in use (peak 2.00 GiB) of 4.00 GiB; params 1.00 GiB, grads 512 MiB ..."
  std::string report(MemorySpace space) const;

 private:
  std::string report_locked(MemorySpace space) const;
  mutable std::mutex mutex_;
  std::int64_t capacity_;
  std::array<MemoryUsage, kNumMemorySpaces> usage_{};
};

// "1.50 GiB", "512 MiB", "4.0 KiB", "17 B".
std::string format_bytes(std::int64_t bytes);

}  // namespace zrt
