#include "tools/mem/mpi_scratch.h"

#include <algorithm>
#include <climits>

#include "runtime/common/dtype.h"
#include "runtime/engine/engine_parallel_dims.h"

namespace zrt::mem {

namespace {

// The collective scratch an MpiProcessGroup allocates (mpi_process_group.cc): two slots that
// grow to the largest request and stay, so the peak is the sum of the two largest requests. A
// group of one rank asks for none: its reductions return their input (copy_alone).
class MpiScratch {
 public:
  MpiScratch(int size, const CommOptions& options) : size_(size), options_(options) {}
  void all_reduce_float(std::int64_t count, std::int64_t elem) {
    if (size_ == 1) return;
    const std::int64_t piece = chunk(elem) * size_;
    const std::int64_t total = std::min(piece, count);
    const std::int64_t slice = (total + size_ - 1) / size_;
    grow(0, slice * size_ * elem);
    grow(1, slice * size_ * elem);
  }
  void reduce_scatter(std::int64_t count, std::int64_t elem) {
    if (size_ == 1) return;
    const std::int64_t c = chunk(elem);
    if (options_.reduce_scatter_algo == ReduceScatterAlgo::kNative) {
      const std::int64_t n = std::min(c, count);
      if (n != count) grow(1, size_ * n * elem);
      grow(0, n * elem);
      return;
    }
    grow(0, size_ * std::min(c, count) * elem);
    if ((count + c - 1) / c > 1) grow(1, size_ * c * elem);
  }
  std::int64_t bytes() const { return slot_[0] + slot_[1]; }
  int size() const { return size_; }

 private:
  std::int64_t chunk(std::int64_t elem) const {
    const std::int64_t per_part = options_.max_chunk_bytes / (elem * size_);
    return std::max<std::int64_t>(1, std::min<std::int64_t>(per_part, INT_MAX / elem));
  }
  void grow(int slot, std::int64_t bytes) { slot_[slot] = std::max(slot_[slot], bytes); }
  int size_;
  const CommOptions& options_;
  std::int64_t slot_[2] = {0, 0};
};

// One engine group's communicators: the ranks its units are sliced over and, under MiCS, their
// replicas (each gradient slice averaged again over them: zero_engine's make_reduce_scatter).
struct GroupScratch {
  GroupScratch(int shard_world, int replica_world, const CommOptions& comm)
      : shard(shard_world, comm), replicas(replica_world, comm), replicated(replica_world > 1) {}
  MpiScratch shard, replicas;
  bool replicated;
  std::int64_t bytes() const { return shard.bytes() + replicas.bytes(); }
};

// What the engine's collectives (zero_engine.cc: reduce_unit, step) and zrt-train's control
// group (one fp32 all-reduce of 3 values per step) leave allocated on the CPU backend.
// Each engine group has communicators of its own: the dense units' shard group (the world, or
// MiCS's shard group and its replicas) and, under expert parallelism (ep > 1), the experts'
// (group 1: their expert-data-parallel group of world / ep ranks, or under MiCS its share of a
// shard block and the replicas), which also sums their gradient norm; the expert-parallel group
// (ep ranks) sums it again as the units' norm peers; the dispatch's all_to_all and all_to_allv
// there use no scratch.
}  // namespace

std::int64_t mpi_scratch_bytes(const std::vector<UnitSize>& units, const EngineOptions& o,
                               int world, const CommOptions& comm, bool trainer,
                               std::int64_t sequence_sum_floats) {
  const auto wire =
      static_cast<std::int64_t>(dtype_size(o.communication_dtype.value_or(o.compute_dtype)));
  const ParallelDims dims = parallel_dims(o, world, 0);
  const int ep = o.expert_parallel_size;
  const int dense_world = dims.uses_mics() ? dims.mics_shard_size : world;
  std::vector<GroupScratch> groups;
  groups.emplace_back(dense_world, world / dense_world, comm);
  if (ep > 1) {
    const int expert_world = dims.expert_shard_world();
    groups.emplace_back(expert_world, dims.expert_data_parallel_size() / expert_world, comm);
  }
  // qgZ: stages 2-3 reduce through the quantized collectives' all-to-alls (no MPI scratch).
  const bool quantized = o.quantized_gradients && o.stage >= 2;
  for (const UnitSize& u : units) {
    if (u.frozen) continue;  // never reduced
    GroupScratch& group = groups[static_cast<std::size_t>(u.group)];
    const bool collective = group.shard.size() > 1 || group.replicated;
    if (o.stage == 0 && collective) group.shard.all_reduce_float(u.numel, wire);
    if (((o.stage == 1 && collective) || o.stage >= 2) && !quantized) {
      group.shard.reduce_scatter(u.shard, wire);
    }
    if (o.stage >= 1 && group.replicated) group.replicas.all_reduce_float(u.shard, wire);
  }
  std::int64_t engine = 0;
  for (GroupScratch& group : groups) {
    if (o.stage >= 1 && group.shard.size() > 1) group.shard.all_reduce_float(1, 4);  // the norm
    engine += group.bytes();
  }
  if (ep > 1) {
    MpiScratch expert_parallel(ep, comm);
    expert_parallel.all_reduce_float(1, 4);
    engine += expert_parallel.bytes();
  }
  MpiScratch control(world, comm);
  // The mean loss and the step boundary's votes (stop, wall-clock save): train/training_loop.cc.
  if (trainer) control.all_reduce_float(3, 4);
  // The sequence-parallel group's own communicator: the model's sums over a forward's tokens
  // (its all-to-alls use no scratch).
  MpiScratch sequence(o.sequence_parallel_size, comm);
  if (o.sequence_parallel_size > 1 && sequence_sum_floats > 0) {
    sequence.all_reduce_float(sequence_sum_floats, 4);
  }
  return engine + control.bytes() + sequence.bytes();
}

}  // namespace zrt::mem
