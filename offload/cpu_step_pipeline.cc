#include "offload/cpu_step_pipeline.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <exception>
#include <mutex>

#include "runtime/common/error.h"

namespace zrt {

namespace {

// 256 KiB of each fp32 array, as optimizers/cpu_slice_step.h: long enough for the hardware
// prefetcher's streams, short enough that a block of a few million elements makes many more
// chunks than threads.
constexpr std::int64_t kChunkElements = 1 << 16;
constexpr std::int64_t kChunkAlignBytes = 256;
// Below this many elements per thread another thread costs more than it saves (as
// optimizers/cpu_slice_step.h): a small model's step runs on fewer threads.
constexpr std::int64_t kMinElementsPerThread = 1 << 15;

// The unit's padding (CpuStepUnit::padding) as a chunk's slice index.
constexpr std::size_t kPaddingChunk = static_cast<std::size_t>(-1);

struct Chunk {
  std::size_t unit = 0;
  std::size_t slice = 0;  // index into the unit's slices, or kPaddingChunk
  std::int64_t begin = 0;
  std::int64_t end = 0;
};

// Waits for `event` unless a thread already saw it complete.
void wait_once(Event* event, std::atomic<bool>& seen) {
  if (event == nullptr || seen.load(std::memory_order_acquire)) return;
  event->synchronize();
  seen.store(true, std::memory_order_release);
}

}  // namespace

std::vector<CpuStepRange> cpu_step_chunks(const float* param, std::int64_t numel,
                                          std::int64_t chunk, std::int64_t align_bytes) {
  ZRT_CHECK(chunk >= 1 && align_bytes >= 1, "cpu_step_chunks: chunk {} / alignment {}", chunk,
            align_bytes);
  std::vector<CpuStepRange> ranges;
  if (numel <= 0) return ranges;
  // Elements to the first aligned address (0 when param is not even float-aligned).
  const auto address = reinterpret_cast<std::uintptr_t>(param);
  std::int64_t first = 0;
  if (address % sizeof(float) == 0) {
    const auto misalign =
        static_cast<std::int64_t>(address % static_cast<std::uintptr_t>(align_bytes));
    first = misalign == 0 ? 0 : (align_bytes - misalign) / static_cast<std::int64_t>(sizeof(float));
  }
  std::int64_t begin = 0;
  // A short head up to the first aligned element, then whole chunks from there.
  std::int64_t end = first > 0 ? std::min(numel, first) : std::min(numel, chunk);
  while (begin < numel) {
    ranges.push_back({begin, end});
    begin = end;
    end = std::min(numel, begin + chunk);
  }
  return ranges;
}

void run_cpu_step_pipeline(std::vector<CpuStepUnit>& units, const HostOptimizer::RangeStep& step,
                           int threads, TraceRecorder* trace) {
  run_cpu_step_pipeline(units, std::vector<HostOptimizer::RangeStep>{step}, threads, trace);
}

void run_cpu_step_pipeline(std::vector<CpuStepUnit>& units,
                           const std::vector<HostOptimizer::RangeStep>& steps, int threads,
                           TraceRecorder* trace) {
  ZRT_CHECK(!steps.empty(), "CPU step: no prepared step");
  const std::size_t count = units.size();
  std::vector<Chunk> chunks;
  std::int64_t elements = 0;
  std::vector<std::int64_t> first_chunk(count, -1);
  std::vector<std::size_t> slice_base(count, 0);  // the unit's first slice in `landed_seen`
  std::size_t slices = 0;
  for (std::size_t u = 0; u < count; ++u) {
    CpuStepUnit& unit = units[u];
    ZRT_CHECK(unit.done != nullptr, "CPU step: unit {} ({}) has no completion", u, unit.trace_name);
    ZRT_CHECK(unit.landed.empty() || unit.landed.size() == unit.slices.size(),
              "CPU step: unit {} has {} landing events for {} slices", u, unit.landed.size(),
              unit.slices.size());
    ZRT_CHECK(unit.step_of.empty() || unit.step_of.size() == unit.slices.size(),
              "CPU step: unit {} has {} step choices for {} slices", u, unit.step_of.size(),
              unit.slices.size());
    for (const std::size_t s : unit.step_of) {
      ZRT_CHECK(s < steps.size(), "CPU step: unit {} asks for step {} of {}", u, s, steps.size());
    }
    slice_base[u] = slices;
    slices += unit.slices.size();
    for (std::size_t k = 0; k < unit.slices.size(); ++k) {
      const OptimizerSlice& slice = unit.slices[k];
      for (const CpuStepRange& r :
           cpu_step_chunks(slice.param, slice.numel, kChunkElements, kChunkAlignBytes)) {
        if (first_chunk[u] < 0) first_chunk[u] = static_cast<std::int64_t>(chunks.size());
        chunks.push_back({u, k, r.begin, r.end});
        elements += r.end - r.begin;
      }
    }
    // After the unit's slices, so a unit of padding only (a rank's slice past the unit's last
    // parameter) still waits for its buffer before it is written, and goes up only after.
    if (!unit.padding.empty()) {
      if (first_chunk[u] < 0) first_chunk[u] = static_cast<std::int64_t>(chunks.size());
      chunks.push_back({u, kPaddingChunk, 0, 0});
    }
  }
  std::vector<std::atomic<std::int64_t>> remaining(count);
  std::vector<std::atomic<bool>> slot_seen(count);
  std::vector<std::atomic<bool>> landed_seen(slices);
  std::vector<std::atomic<bool>> finished(count);
  std::vector<double> start_us(count, 0.0);
  for (std::size_t u = 0; u < count; ++u) {
    remaining[u].store(0, std::memory_order_relaxed);
    slot_seen[u].store(false, std::memory_order_relaxed);
    finished[u].store(false, std::memory_order_relaxed);
  }
  for (auto& seen : landed_seen) seen.store(false, std::memory_order_relaxed);
  for (const Chunk& c : chunks) remaining[c.unit].fetch_add(1, std::memory_order_relaxed);

  std::mutex error_mutex;
  std::exception_ptr error;
  std::atomic<bool> failed{false};
  auto fail = [&](std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(error_mutex);
    if (!error) error = e;
    failed.store(true, std::memory_order_release);
  };
  auto finish = [&](std::size_t u) {
    CpuStepUnit& unit = units[u];
    if (unit.after) unit.after();
    if (trace != nullptr) {
      trace->add(TraceTrack::kCpuOptimizer, unit.trace_name, start_us[u],
                 trace->now_us() - start_us[u]);
    }
    finished[u].store(true, std::memory_order_release);
    unit.done->set_value();
    if (unit.released) unit.released();
  };

  // A unit without elements (an empty shard) has nothing to write or wait for: done at once.
  std::atomic<std::int64_t> cursor{0};
  const auto total = static_cast<std::int64_t>(chunks.size());
  for (std::size_t u = 0; u < count; ++u) {
    if (first_chunk[u] >= 0) continue;
    try {
      if (trace != nullptr) start_us[u] = trace->now_us();
      finish(u);
    } catch (...) {
      fail(std::current_exception());
    }
  }
  const std::int64_t useful =
      std::min(total, (elements + kMinElementsPerThread - 1) / kMinElementsPerThread);
  const int team = static_cast<int>(std::clamp<std::int64_t>(useful, 1, std::max(threads, 1)));
  if (total > 0 && !failed.load(std::memory_order_acquire)) {
#pragma omp parallel num_threads(team)
    {
      for (;;) {
        if (failed.load(std::memory_order_acquire)) break;
        const std::int64_t c = cursor.fetch_add(1, std::memory_order_relaxed);
        if (c >= total) break;
        const Chunk& chunk = chunks[static_cast<std::size_t>(c)];
        CpuStepUnit& unit = units[chunk.unit];
        try {
          wait_once(unit.slot_free, slot_seen[chunk.unit]);
          if (chunk.slice == kPaddingChunk) {
            for (const CpuStepZeroRange& z : unit.padding) std::memset(z.at, 0, z.bytes);
          } else if (!unit.landed.empty()) {
            wait_once(unit.landed[chunk.slice], landed_seen[slice_base[chunk.unit] + chunk.slice]);
          }
          if (trace != nullptr && c == first_chunk[chunk.unit])
            start_us[chunk.unit] = trace->now_us();
          if (chunk.slice != kPaddingChunk) {
            steps[unit.step_of.empty() ? 0 : unit.step_of[chunk.slice]](unit.slices[chunk.slice],
                                                                        chunk.begin, chunk.end);
          }
          // acq_rel: the thread that finishes the unit sees every other chunk's writes (and the
          // first chunk's start time) before it lets the unit go up.
          if (remaining[chunk.unit].fetch_sub(1, std::memory_order_acq_rel) == 1)
            finish(chunk.unit);
        } catch (...) {
          fail(std::current_exception());
        }
      }
    }
  }
  if (!error) return;
  for (std::size_t u = 0; u < count; ++u) {
    if (finished[u].load(std::memory_order_acquire)) continue;
    units[u].done->set_exception(error);
    if (units[u].released) units[u].released();
  }
  std::rethrow_exception(error);
}

}  // namespace zrt
