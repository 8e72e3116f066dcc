// The range arithmetic of zrt's collectives, shared by the MPI and NCCL groups: how a large
// transfer is cut into chunks (bounded scratch memory, MPI's int counts) and how the
// deterministic all-reduce lays out its pieces. Pure functions, no communication, so they are
// tested on their own (tests/comm/test_collective_plan.cc).
//
// The deterministic all-reduce on floats is a reduce-scatter followed by an all-gather over a
// zero-padded copy of each piece: every rank sums the same elements in the same (rank) order,
// so the replicas stay bit-identical, which a tree or ring all-reduce does not promise.
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
#include <limits>

namespace zrt::collective_plan {

// The largest count an int-counted API (MPI) accepts, in elements of `elem_bytes`.
constexpr std::int64_t int_count_limit(std::int64_t elem_bytes) {
  return INT_MAX / elem_bytes;
}

// Elements per part in one chunk of a transfer split into `parts` equal parts (one per rank):
// as many as keep the whole chunk within `max_chunk_bytes`, at most `max_elements` (an API's
// count limit), and at least 1 so that every transfer makes progress.
constexpr std::int64_t chunk_elements(
    std::int64_t max_chunk_bytes, std::int64_t elem_bytes, int parts,
    std::int64_t max_elements = std::numeric_limits<std::int64_t>::max()) {
  return std::max<std::int64_t>(1, std::min(max_chunk_bytes / (elem_bytes * parts), max_elements));
}

// A half-open range [first, first + count) of elements (or bytes).
struct Range {
  std::int64_t first = 0;
  std::int64_t count = 0;
  friend bool operator==(const Range& a, const Range& b) {
    return a.first == b.first && a.count == b.count;
  }
};

// How many chunks of `chunk` cover `total` (0 for an empty transfer).
constexpr std::int64_t chunk_count(std::int64_t total, std::int64_t chunk) {
  return (total + chunk - 1) / chunk;
}

// Chunk `k` of `total` in chunks of `chunk`: every chunk is full but the last.
constexpr Range chunk_range(std::int64_t total, std::int64_t chunk, std::int64_t k) {
  const std::int64_t first = k * chunk;
  return {first, std::min(chunk, total - first)};
}

// Calls fn(Range) for each chunk of `total` in order.
template <typename Fn>
void for_each_chunk(std::int64_t total, std::int64_t chunk, Fn&& fn) {
  for (std::int64_t first = 0; first < total; first += chunk) {
    fn(Range{first, std::min(chunk, total - first)});
  }
}

// One piece of the deterministic all-reduce: input elements `input`, zero-padded to
// `slice * ranks` elements so that each rank reduces one slice of `slice` elements (rank r's
// slice starts at element r * slice of the padded piece).
struct AllReducePiece {
  Range input;
  std::int64_t slice = 0;
  std::int64_t padded(int ranks) const { return slice * ranks; }
  std::int64_t padding(int ranks) const { return padded(ranks) - input.count; }
  friend bool operator==(const AllReducePiece& a, const AllReducePiece& b) {
    return a.input == b.input && a.slice == b.slice;
  }
};

// Calls fn(AllReducePiece) for each piece of an all-reduce of `count` elements over `ranks`
// ranks, in order; `chunk` is chunk_elements(...) for `ranks` parts, so a padded piece holds at
// most chunk * ranks elements.
template <typename Fn>
void for_each_all_reduce_piece(std::int64_t count, int ranks, std::int64_t chunk, Fn&& fn) {
  for_each_chunk(count, chunk * ranks, [&](Range input) {
    fn(AllReducePiece{input, (input.count + ranks - 1) / ranks});
  });
}

// Sum of the padded slices of every piece of such an all-reduce: the elements each rank sends
// to every peer in its reduce-scatter, and again in its all-gather.
inline std::int64_t all_reduce_slice_total(std::int64_t count, int ranks, std::int64_t chunk) {
  std::int64_t total = 0;
  for_each_all_reduce_piece(count, ranks, chunk,
                            [&](const AllReducePiece& piece) { total += piece.slice; });
  return total;
}

}  // namespace zrt::collective_plan
