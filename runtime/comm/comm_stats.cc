#include "runtime/comm/comm_stats.h"

namespace zrt {

const char* collective_name(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kAllGather:
      return "all_gather";
    case CollectiveOp::kReduceScatter:
      return "reduce_scatter";
    case CollectiveOp::kAllReduce:
      return "all_reduce";
    case CollectiveOp::kBroadcast:
      return "broadcast";
    case CollectiveOp::kBarrier:
      return "barrier";
  }
  return "?";
}

std::int64_t CommCounts::total_bytes() const {
  std::int64_t total = 0;
  for (auto b : bytes) total += b;
  return total;
}

CommCounts CommCounts::operator-(const CommCounts& o) const {
  CommCounts d;
  for (std::size_t i = 0; i < kNumCollectiveOps; ++i) {
    d.calls[i] = calls[i] - o.calls[i];
    d.bytes[i] = bytes[i] - o.bytes[i];
  }
  return d;
}

CommCounts CommStats::snapshot() const {
  CommCounts c;
  for (std::size_t i = 0; i < kNumCollectiveOps; ++i) {
    c.calls[i] = calls_[i].load(std::memory_order_relaxed);
    c.bytes[i] = bytes_[i].load(std::memory_order_relaxed);
  }
  return c;
}

void CommStats::reset() {
  for (std::size_t i = 0; i < kNumCollectiveOps; ++i) {
    calls_[i].store(0);
    bytes_[i].store(0);
  }
}

}  // namespace zrt
