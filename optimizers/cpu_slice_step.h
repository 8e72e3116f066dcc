// The CPU optimizers' step, shared by CpuAdam and CpuLion: the validation of every slice before any
// memory is touched, and the thread split: the concatenation of all slices is cut into equal
// ranges, one per OpenMP thread, whose boundaries are multiples of kSliceThreadAlign elements (a
// 64-byte line of fp32 for aligned slices); below kMinElementsPerThread elements per thread another
// thread costs more than it saves. Every element's update depends only on its own inputs, so any
// partition gives the same bits; a static one keeps each thread's cache lines its own.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "optimizers/optimizer_slices.h"

namespace zrt::detail {

constexpr std::int64_t kSliceThreadAlign = 64;
constexpr std::int64_t kMinElementsPerThread = 1 << 15;

// Calls run(k, begin, end) for element range [begin, end) of slice k (slice-local indices), over
// every element of every slice, on up to max_threads threads. numel(k) gives slice k's length.
template <typename Numel, typename Run>
void for_each_slice_range(std::size_t count, const Numel& numel, int max_threads, const Run& run) {
  std::vector<std::int64_t> ends(count);  // one past slice k's last element, concatenated
  std::int64_t total = 0;
  for (std::size_t k = 0; k < count; ++k) {
    total += numel(k);
    ends[k] = total;
  }
  if (total == 0) return;
  const int threads = static_cast<int>(std::clamp<std::int64_t>(
      (total + kMinElementsPerThread - 1) / kMinElementsPerThread, 1, max_threads));
  auto run_range = [&](std::int64_t begin, std::int64_t end) {
    std::size_t k =
        static_cast<std::size_t>(std::upper_bound(ends.begin(), ends.end(), begin) - ends.begin());
    for (; k < count && begin < end; ++k) {
      const std::int64_t slice_begin = ends[k] - numel(k);
      const std::int64_t stop = std::min(end, ends[k]);
      if (stop > begin) run(k, begin - slice_begin, stop - slice_begin);
      begin = stop;
    }
  };
  if (threads == 1) {
    run_range(0, total);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    const std::int64_t t = omp_get_thread_num();
    const std::int64_t n = omp_get_num_threads();
    auto boundary = [&](std::int64_t i) {
      return i == n ? total
                    : std::min(total, total * i / n / kSliceThreadAlign * kSliceThreadAlign);
    };
    run_range(boundary(t), boundary(t + 1));
  }
}

// One step of a CPU optimizer over `count` slices with per-step scalars `s`: every slice is
// validated first, then kernel(slice, begin, end, s) runs over all elements on up to max_threads
// threads.
template <typename Slice, typename Scalars>
void step_slices(const Slice* slices, std::size_t count, const Scalars& s,
                 void (*kernel)(const Slice&, std::int64_t, std::int64_t, const Scalars&),
                 int max_threads) {
  for (std::size_t k = 0; k < count; ++k) validate_slice(slices[k], k);
  for_each_slice_range(
      count, [&](std::size_t k) { return slices[k].numel; }, max_threads,
      [&](std::size_t k, std::int64_t begin, std::int64_t end) {
        kernel(slices[k], begin, end, s);
      });
}

}  // namespace zrt::detail
