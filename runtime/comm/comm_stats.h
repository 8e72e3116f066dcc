// Per-operation counters of collectives: calls and payload bytes, counted as nccl-tests does
// (the whole array: all-gather and reduce-scatter count recvcount x N elements, all-reduce and
// broadcast the buffer). Thread-safe.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

namespace zrt {

enum class CollectiveOp { kAllGather, kReduceScatter, kAllReduce, kBroadcast, kBarrier };
constexpr std::size_t kNumCollectiveOps = 5;
const char* collective_name(CollectiveOp op);  // "all_gather", ...

struct CommCounts {
  std::array<std::int64_t, kNumCollectiveOps> calls{};
  std::array<std::int64_t, kNumCollectiveOps> bytes{};
  std::int64_t total_bytes() const;
  CommCounts operator-(const CommCounts& o) const;
};

class CommStats {
 public:
  void add(CollectiveOp op, std::int64_t bytes) {
    calls_[static_cast<std::size_t>(op)].fetch_add(1, std::memory_order_relaxed);
    bytes_[static_cast<std::size_t>(op)].fetch_add(bytes, std::memory_order_relaxed);
  }
  CommCounts snapshot() const;
  void reset();

 private:
  std::array<std::atomic<std::int64_t>, kNumCollectiveOps> calls_{};
  std::array<std::atomic<std::int64_t>, kNumCollectiveOps> bytes_{};
};

}  // namespace zrt
