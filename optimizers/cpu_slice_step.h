// The CPU optimizers' step, shared by CpuAdam and CpuLion: the validation of every slice before any
// memory is touched, and the thread split. The concatenation of all slices is cut into chunks whose
// boundaries are multiples of kSliceThreadAlign elements (a 64-byte line of fp32 for aligned
// slices), at most kChunkElements long, and the OpenMP threads take chunks in turn (a dynamic
// schedule); below kMinElementsPerThread elements per thread another thread costs more than it
// saves. Every element's update depends only on its own inputs, so any partition gives the same
// bits.
//
// Why chunks and not one equal range per thread: with optimizer offload on a GPU host the CPU
// optimizer has every core, and the threads that launch kernels and run the copy stream's
// callbacks take one from it now and then. With a static split the thread that lost its core
// finishes last and the whole unit waits for it (an H100 host's 16 threads stepped GPT-2's
// 7M-parameter blocks at 4.2 G parameters/s against 5.2 on the 39M-parameter embedding, where the
// same delay weighs less; BENCHMARKS.md, "GPU session"). With chunks the others take its share.
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
// 256 KiB of each fp32 array: long enough for the hardware prefetcher's streams, short enough
// that a unit of a few million elements makes many more chunks than threads.
constexpr std::int64_t kChunkElements = 1 << 16;

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
  // One chunk per thread for small steps, kChunkElements for large ones; a multiple of
  // kSliceThreadAlign.
  const std::int64_t per_thread = (total + threads - 1) / threads;
  const std::int64_t chunk = std::min(
      kChunkElements, (per_thread + kSliceThreadAlign - 1) / kSliceThreadAlign * kSliceThreadAlign);
  const std::int64_t chunks = (total + chunk - 1) / chunk;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (std::int64_t c = 0; c < chunks; ++c) {
    run_range(c * chunk, std::min(total, (c + 1) * chunk));
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
