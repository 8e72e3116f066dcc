// ProcessGroup: the collectives seam. Stream-ordered and asynchronous, as NCCL: each call
// enqueues the operation on the group's stream and returns at once; record an event after it
// to know when its output is ready or its input may be reused.
//
// One group = one communicator = one issuing stream. MPI forbids concurrent collectives on a
// communicator and every rank must issue them in the same order, so each stream that
// communicates gets its own group (create them in the same order on every rank, from one
// thread). Buffers are device memory: a CPU device pairs with MPI, a CUDA device with NCCL.
//
// Reductions on 16-bit floats are summed in fp32, in rank order, so every rank (and every run)
// gets bit-identical results; all_reduce on floats is a reduce-scatter followed by an
// all-gather for the same reason.
//
// Every operation honours CommOptions::timeout_s: one that does not finish in time makes the
// stream fail with zrt::Timeout naming the operation, its size, the group, the ranks missing
// and (with a watchdog) the training step; the watchdog is told first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <mpi.h>

#include "runtime/comm/collective_sequence_check.h"
#include "runtime/comm/comm_stats.h"
#include "runtime/common/dtype.h"
#include "runtime/common/watchdog.h"
#include "runtime/device/device.h"

namespace zrt {

enum class ReduceOp { kSum, kAvg, kMax };
const char* reduce_op_name(ReduceOp op);

// How the MPI backend implements reduce-scatter.
enum class ReduceScatterAlgo {
  kAlltoall,  // each rank's blocks exchanged point to point + local fp32 sum in rank order
              // (default; 2.4-5x faster than MPI_Reduce_scatter_block here)
  kNative,    // MPI_Ireduce_scatter_block (fp32 and integers only)
};

// How the MPI backend implements all-gather.
enum class AllGatherAlgo {
  kAuto,          // kPointToPoint up to CommOptions::direct_all_gather_bytes per rank, else kMpi
                  // (default; see BENCHMARKS.md for the measurements behind the switch)
  kMpi,           // MPI_Iallgather (point to point beyond int counts)
  kPointToPoint,  // every slice sent to every peer, in pieces of max_chunk_bytes
};

// The pieces of an all_to_allv, in elements, one entry per member of the group: piece p of the
// input (send_counts[p] elements at send_offsets[p]) goes to rank p, piece p of the output
// (recv_counts[p] at recv_offsets[p]) comes from rank p. Any piece may be empty; pieces may be
// in any order and leave gaps (the output's gaps are left as they were). The counts are this
// rank's: recv_counts[p] here must equal send_counts[rank] on rank p (a mixture-of-experts
// layer exchanges its count vectors with all_to_all first, expert_dispatch.h).
struct AllToAllvLayout {
  std::vector<std::int64_t> send_counts, send_offsets, recv_counts, recv_offsets;

  // Builds the layout of pieces packed back to back in member order (offsets are the prefix
  // sums of the counts).
  static AllToAllvLayout packed(std::vector<std::int64_t> send_counts,
                                std::vector<std::int64_t> recv_counts);
  // Elements of input (output) the pieces span: max(offset + count), 0 when all are empty.
  std::int64_t send_extent() const;
  std::int64_t recv_extent() const;
  std::int64_t send_total() const;  // sum of send_counts
  std::int64_t recv_total() const;  // sum of recv_counts
};

struct CommOptions {
  double timeout_s = 600.0;
  // Optional: told about every timeout (it names the step and may end the run) and watching
  // every operation in flight as a backstop. Shared by all groups of a run.
  std::shared_ptr<Watchdog> watchdog;
  ReduceScatterAlgo reduce_scatter_algo = ReduceScatterAlgo::kAlltoall;
  AllGatherAlgo all_gather_algo = AllGatherAlgo::kAuto;
  // kAuto's switch: slices of at most this many bytes go point to point. OpenMPI 4.1's
  // MPI_Iallgather (libnbc) costs 1.4-2.5x MPI_Allgather below a few MiB here, while posting
  // every send and receive at once matches it (it is what MPI_Allgather's two-process
  // algorithm does).
  std::int64_t direct_all_gather_bytes = std::int64_t{8} << 20;
  // Largest piece one MPI call moves per rank; bounds scratch memory and keeps counts in int.
  std::int64_t max_chunk_bytes = std::int64_t{32} << 20;
  // CPU backend only: model a link. An operation completes no earlier than
  // latency + bus bytes / bandwidth after it starts (a sleep, costing no CPU). 0 disables.
  double simulated_bandwidth_bytes_per_s = 0.0;
  double simulated_latency_s = 0.0;
  // CPU backend, benchmarks only: the modelled link alone. No bytes move between ranks; each
  // operation fills its output from this rank's own input, as if every rank held the same data
  // (averages are exact, sums count this rank only), then waits out the link. The results are
  // not a real run's: this times the engine's schedule against the link without the MPI
  // progress of shared-memory transfers competing with compute for the host's cores (on a GPU
  // the collectives do not run on the compute's cores either).
  bool simulated_link_only = false;
  // Ranks per node for NodeTopology::detect (topology.h); 0: as MPI reports them. A smaller
  // value makes one machine act as several nodes (tests). Config key comm.ranks_per_node.
  int ranks_per_node = 0;
  // Collectives over MPI through pinned host memory (staged_process_group.h) instead of the
  // device backend's (NCCL): for ranks that share a GPU, which NCCL refuses. zrt-train sets it
  // when a node has more ranks than GPUs, or when comm.host_staged_collectives asks.
  bool host_staged = false;
  // Debug: every operation is first agreed on by the group's ranks, and the first one that
  // differs across ranks stops them all with an Error naming it, instead of a hang
  // (collective_sequence_check.h). Config key comm.check_collective_sequence.
  bool check_collective_sequence = false;
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }
  Stream& stream() const { return *stream_; }
  const CommStats& stats() const { return stats_; }
  CommStats& stats() { return stats_; }

  // out[r*count .. (r+1)*count) = in of rank r. In place when in == out + rank*count.
  virtual void all_gather(DevicePtr<const std::byte> in, DevicePtr<std::byte> out,
                          std::int64_t count, DType dtype) = 0;
  // out (count elements) = op over ranks of in[rank*count .. (rank+1)*count). kSum or kAvg.
  // In place when out == in + rank*count.
  virtual void reduce_scatter(DevicePtr<const std::byte> in, DevicePtr<std::byte> out,
                              std::int64_t count, DType dtype, ReduceOp op) = 0;
  // out = op over ranks of in (count elements); in == out is allowed. Floats: kSum, kAvg;
  // integers: kSum, kMax.
  virtual void all_reduce(DevicePtr<const std::byte> in, DevicePtr<std::byte> out,
                          std::int64_t count, DType dtype, ReduceOp op) = 0;
  // out block p (count elements, at out + p*count) = block `rank` of rank p's in (block q at
  // in + q*count). in and out must not overlap.
  virtual void all_to_all(DevicePtr<const std::byte> in, DevicePtr<std::byte> out,
                          std::int64_t count, DType dtype) = 0;
  // Piece p of `in` to rank p, piece p of `out` from rank p, as `layout` says (counts differ
  // per rank and per peer, any may be 0). Every member calls it, whatever its counts: an empty
  // piece is still a message (zero bytes), so a rank with nothing to send cannot leave the
  // others waiting. The input and output extents must not overlap. Counted as an all_to_all
  // (comm_stats.h): bytes = the elements this rank receives, its own piece included.
  virtual void all_to_allv(DevicePtr<const std::byte> in, DevicePtr<std::byte> out,
                           const AllToAllvLayout& layout, DType dtype) = 0;
  // buf on every rank = buf of `root`.
  virtual void broadcast(DevicePtr<std::byte> buf, std::int64_t count, DType dtype, int root) = 0;
  // Stream-ordered barrier: later work on the stream starts after every rank reached it.
  virtual void barrier() = 0;

  // Splits the group by colour (ranks with equal colour form a group, ordered by key, then
  // by rank). Collective over this group; call it from the thread that owns the stream.
  // The new group issues on `stream`.
  virtual std::unique_ptr<ProcessGroup> split(int color, int key, Stream& stream,
                                              const std::string& name) = 0;

  // The node of each member, in group rank order: what the byte counters split intra- and
  // inter-node traffic by (comm_stats.h). One node for all unless set; a group over the world
  // takes NodeTopology::node_map(), sub-groups get theirs from make_subgroup (topology.h).
  const std::vector<int>& node_map() const { return node_map_; }
  // Throws unless nodes has one entry per member.
  void set_node_map(std::vector<int> nodes);
  // The debug check of the operations' order across ranks (CommOptions::
  // check_collective_sequence); null when off. make_process_group and make_subgroup set it.
  CollectiveSequenceCheck* sequence_check() const { return sequence_check_.get(); }
  void set_sequence_check(std::unique_ptr<CollectiveSequenceCheck> check) {
    sequence_check_ = std::move(check);
  }
  // Members on this rank's node other than itself, and members on other nodes.
  int peers_on_node() const { return peers_on_node_; }
  int peers_off_node() const { return size_ - 1 - peers_on_node_; }

 protected:
  ProcessGroup(int rank, int size, std::string name, Stream* stream)
      : rank_(rank), size_(size), name_(std::move(name)), stream_(stream) {}

  // "all_gather of 1000 x fp32 on group 'g' (rank 0 of 2)": how errors name an operation.
  std::string describe(const char* op, std::int64_t count, DType dtype) const;
  // The argument checks every backend makes before it enqueues anything (they throw).
  // Rules that do not depend on the buffers come first: the overlap checks depend on the rank
  // (at rank > 0 null pointers "overlap"), so they would mask the other errors on some ranks.
  void check_all_gather(const std::byte* in, const std::byte* out, std::int64_t count,
                        DType dtype) const;
  void check_reduce_scatter_op(std::int64_t count, DType dtype, ReduceOp op) const;
  void check_reduce_scatter_buffers(const std::byte* in, const std::byte* out, std::int64_t count,
                                    DType dtype) const;
  void check_all_reduce_op(std::int64_t count, DType dtype, ReduceOp op) const;
  void check_all_reduce_buffers(const std::byte* in, const std::byte* out, std::int64_t count,
                                DType dtype) const;
  void check_broadcast(std::int64_t count, int root) const;
  // What barrier() checks (the sequence check only).
  void check_barrier() const;
  void check_all_to_all(const std::byte* in, const std::byte* out, std::int64_t count,
                        DType dtype) const;
  // The sequence check hashes the operation and its dtype only: the counts of an all_to_allv
  // legitimately differ across ranks. Then: one entry per member in every vector, no negative
  // count or offset, this rank's own piece the same size both ways, no overlap.
  void check_all_to_allv(const std::byte* in, const std::byte* out, const AllToAllvLayout& layout,
                         DType dtype) const;
  // Bytes this rank sends in an all_to_allv (its pieces for the other members, by node).
  LinkBytes all_to_allv_link_bytes(const AllToAllvLayout& layout, DType dtype) const;
  // Bytes this rank sends when it sends `bytes_per_peer` to every other member.
  LinkBytes direct_link_bytes(std::int64_t bytes_per_peer) const {
    return {bytes_per_peer * peers_on_node(), bytes_per_peer * peers_off_node()};
  }
  // Bytes this rank sends in one operation (comm_stats.h's traffic model). `chunk`: elements
  // per rank in one piece of the all-reduce (the backend's chunk_elements), which sets its
  // padding; `root`: the broadcast's.
  LinkBytes link_bytes(CollectiveOp op, std::int64_t count, DType dtype, std::int64_t chunk,
                       int root = 0) const;
  // Called by constructors once rank_ and size_ are known: one node for all.
  void reset_node_map();
  int rank_;
  int size_;
  std::string name_;
  Stream* stream_;
  CommStats stats_;
  std::vector<int> node_map_{0};
  int peers_on_node_ = 0;
  std::unique_ptr<CollectiveSequenceCheck> sequence_check_;
  // Tells the sequence check (if any) about the next operation, in words that are the same on
  // every rank that issues the same operation.
  void verify_sequence(const std::string& operation) const;
};

// Creates a group over `parent` (duplicated, so the group has its own communicator) issuing on
// `stream`, of the kind `device` needs (MPI for cpu, NCCL for cuda). Collective over parent.
std::unique_ptr<ProcessGroup> make_process_group(Device& device, MPI_Comm parent, Stream& stream,
                                                 const std::string& name,
                                                 const CommOptions& options = {});

// Payload bytes of one operation as nccl-tests counts them, and its bus-bandwidth factor.
std::int64_t collective_bytes(CollectiveOp op, std::int64_t count, DType dtype, int world);
double bus_factor(CollectiveOp op, int world);

}  // namespace zrt
