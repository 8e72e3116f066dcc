// One rank's checkpoint file: writing it from a host snapshot of the rank's slices, and the
// resharding reader that fills any rank's slices of any partition plan from the rank files of
// a checkpoint (layout.h).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/checkpoint/h5.h"
#include "runtime/checkpoint/layout.h"
#include "runtime/engine/partition.h"

namespace zrt::checkpoint {

// One rank's whole slice (every unit, in unit order), as a rank file holds it: three host arrays
// of `elements` floats that the caller keeps alive and unchanged while it is written.
struct RankState {
  int rank = 0;
  std::int64_t elements = 0;
  const float* master = nullptr;
  const float* exp_avg = nullptr;
  const float* exp_avg_sq = nullptr;
  std::int64_t bytes() const { return elements * 3 * 4; }
};

// Host copies of one rank's whole slice that own their memory (tests, tools).
struct RankSnapshot {
  int rank = 0;
  std::vector<float> master, exp_avg, exp_avg_sq;
  std::int64_t bytes() const {
    return static_cast<std::int64_t>(master.size() + exp_avg.size() + exp_avg_sq.size()) * 4;
  }
  RankState view() const {
    return RankState{rank, static_cast<std::int64_t>(master.size()), master.data(), exp_avg.data(),
                     exp_avg_sq.data()};
  }
};

// Writes `state` to `path` (rank `state.rank` of `world`), closes it and fsyncs it. Each
// dataset's writeback to the device is started as soon as it is written (sync_file_range), so
// the disk works while the next dataset is written and the checksums are computed; the final
// fsync waits only for the rest.
// kill_midway (a test hook): after the first dataset is flushed, the process raises SIGKILL.
void write_rank_file(const std::string& path, const RankState& state, int world, std::uint64_t seed,
                     bool kill_midway = false);
inline void write_rank_file(const std::string& path, const RankSnapshot& snapshot, int world,
                            std::uint64_t seed, bool kill_midway = false) {
  write_rank_file(path, snapshot.view(), world, seed, kill_midway);
}

// Flushes a file or directory to stable storage (fsync); throws naming it.
void fsync_path(const std::string& path, bool directory = false);

// Reads the slices a rank of a (possibly different) partition plan owns from the rank files of
// the checkpoint in `dir` whose validated index is `index`. Each fill() reads only the ranges
// of the old slices that fall in the requested new slice (HDF5 hyperslabs, rounded out to the
// checksum blocks they verify). Rank files are opened on first use and checked: format, rank,
// world, dataset types and lengths against the index, before anything is read from them.
// Not thread-safe.
class ShardedReader {
 public:
  ShardedReader(std::string dir, const CheckpointIndex& index);
  ~ShardedReader();
  // Writes rank `rank`'s slice of unit `u` of `plan` (plan.unit(u).shard floats each, padding
  // zero) into master / exp_avg / exp_avg_sq. The plan's parameters must be the index's. Where
  // the old and new slices line up, the file's bytes are read straight into the destination.
  void fill(const PartitionPlan& plan, int rank, int u, float* master, float* exp_avg,
            float* exp_avg_sq);
  std::int64_t bytes_read() const { return bytes_read_; }

 private:
  struct OpenFile;
  OpenFile& file(int old_rank);
  std::string dir_;
  const CheckpointIndex& index_;
  std::map<int, std::unique_ptr<OpenFile>> files_;
  std::vector<unsigned char> scratch_;
  std::vector<float> span_;
  std::int64_t bytes_read_ = 0;
};

// Checks one rank file completely (format, shapes, every checksum); returns the bytes checked.
std::int64_t verify_rank_file(const std::string& path, const CheckpointIndex& index, int rank);

}  // namespace zrt::checkpoint
