// Per-operation counters of collectives. Two views of the same traffic, both thread-safe:
//
// - calls and payload bytes as nccl-tests counts them (the whole array: all-gather,
//   reduce-scatter and all-to-all count count x N elements, all-reduce and broadcast the
//   buffer), the same on every rank;
// - the bytes this rank sends, split by where they go: to ranks on its own node (intra) or on
//   other nodes (inter), by the node map of the group (ProcessGroup::node_map). The traffic is
//   the direct exchange zrt's algorithms perform: all-gather sends this rank's slice to every
//   peer (OpenMPI's libnbc linear MPI_Iallgather; NCCL's ring moves the same bytes per rank
//   through its neighbours), reduce-scatter and all-to-all send block p to rank p, the float
//   all-reduce does both on zero-padded slices; integer all-reduce is counted as the float
//   one, broadcast as the root sending the buffer to every peer (docs/multi-node.md).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

namespace zrt {

enum class CollectiveOp { kAllGather, kReduceScatter, kAllReduce, kBroadcast, kBarrier, kAllToAll };
constexpr std::size_t kNumCollectiveOps = 6;
const char* collective_name(CollectiveOp op);  // "all_gather", ...

// Bytes one rank sends in one operation, by destination: its own node or another.
struct LinkBytes {
  std::int64_t intra = 0;
  std::int64_t inter = 0;
};

struct CommCounts {
  std::array<std::int64_t, kNumCollectiveOps> calls{};
  std::array<std::int64_t, kNumCollectiveOps> bytes{};        // nccl-tests' bytes
  std::array<std::int64_t, kNumCollectiveOps> intra_bytes{};  // sent to this rank's node
  std::array<std::int64_t, kNumCollectiveOps> inter_bytes{};  // sent to other nodes
  std::int64_t total_bytes() const;
  std::int64_t total_intra_bytes() const;
  std::int64_t total_inter_bytes() const;
  CommCounts operator-(const CommCounts& o) const;
  CommCounts& operator+=(const CommCounts& o);
};

class CommStats {
 public:
  void add(CollectiveOp op, std::int64_t bytes, LinkBytes sent = {}) {
    const auto i = static_cast<std::size_t>(op);
    calls_[i].fetch_add(1, std::memory_order_relaxed);
    bytes_[i].fetch_add(bytes, std::memory_order_relaxed);
    intra_[i].fetch_add(sent.intra, std::memory_order_relaxed);
    inter_[i].fetch_add(sent.inter, std::memory_order_relaxed);
  }
  CommCounts snapshot() const;
  void reset();

 private:
  std::array<std::atomic<std::int64_t>, kNumCollectiveOps> calls_{};
  std::array<std::atomic<std::int64_t>, kNumCollectiveOps> bytes_{};
  std::array<std::atomic<std::int64_t>, kNumCollectiveOps> intra_{};
  std::array<std::atomic<std::int64_t>, kNumCollectiveOps> inter_{};
};

}  // namespace zrt
