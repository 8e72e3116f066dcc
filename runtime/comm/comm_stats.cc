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
    case CollectiveOp::kAllToAll:
      return "all_to_all";
  }
  return "?";
}

namespace {

std::int64_t sum(const std::array<std::int64_t, kNumCollectiveOps>& a) {
  std::int64_t total = 0;
  for (auto b : a) total += b;
  return total;
}

}  // namespace

std::int64_t CommCounts::total_bytes() const {
  return sum(bytes);
}
std::int64_t CommCounts::total_intra_bytes() const {
  return sum(intra_bytes);
}
std::int64_t CommCounts::total_inter_bytes() const {
  return sum(inter_bytes);
}

CommCounts CommCounts::operator-(const CommCounts& o) const {
  CommCounts d;
  for (std::size_t i = 0; i < kNumCollectiveOps; ++i) {
    d.calls[i] = calls[i] - o.calls[i];
    d.bytes[i] = bytes[i] - o.bytes[i];
    d.intra_bytes[i] = intra_bytes[i] - o.intra_bytes[i];
    d.inter_bytes[i] = inter_bytes[i] - o.inter_bytes[i];
  }
  return d;
}

CommCounts& CommCounts::operator+=(const CommCounts& o) {
  for (std::size_t i = 0; i < kNumCollectiveOps; ++i) {
    calls[i] += o.calls[i];
    bytes[i] += o.bytes[i];
    intra_bytes[i] += o.intra_bytes[i];
    inter_bytes[i] += o.inter_bytes[i];
  }
  return *this;
}

CommCounts CommStats::snapshot() const {
  CommCounts c;
  for (std::size_t i = 0; i < kNumCollectiveOps; ++i) {
    c.calls[i] = calls_[i].load(std::memory_order_relaxed);
    c.bytes[i] = bytes_[i].load(std::memory_order_relaxed);
    c.intra_bytes[i] = intra_[i].load(std::memory_order_relaxed);
    c.inter_bytes[i] = inter_[i].load(std::memory_order_relaxed);
  }
  return c;
}

void CommStats::reset() {
  for (std::size_t i = 0; i < kNumCollectiveOps; ++i) {
    calls_[i].store(0);
    bytes_[i].store(0);
    intra_[i].store(0);
    inter_[i].store(0);
  }
}

}  // namespace zrt
