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
#include "runtime/checkpoint/param_match.h"
#include "runtime/engine/partition.h"

namespace zrt::checkpoint {

// One rank's whole slice (every unit, in unit order), as a rank file holds it: `elements` floats
// per dataset of CheckpointIndex::state_datasets() (master, then the optimizer's states), in
// host memory the caller keeps alive and unchanged while it is written.
struct RankState {
  int rank = 0;
  std::int64_t elements = 0;
  std::vector<std::string> datasets;  // "/master", "/exp_avg", ...
  // One per dataset: its floats as runs of host memory in order, one run for a snapshot buffer,
  // one per unit for the state written where the engine keeps it.
  std::vector<std::vector<HostBytes>> arrays;
  std::int64_t bytes() const { return elements * static_cast<std::int64_t>(arrays.size()) * 4; }
  bool empty() const { return arrays.empty(); }
};

// Host copies of one rank's whole slice that own their memory (tests, tools). Adam's datasets
// unless set otherwise.
struct RankSnapshot {
  int rank = 0;
  std::vector<std::string> datasets = CheckpointIndex{}.state_datasets();
  std::vector<std::vector<float>> arrays = std::vector<std::vector<float>>(datasets.size());
  std::vector<float>& master() { return arrays[0]; }
  // The arrays' memory, for a SnapshotFiller or ShardedReader::fill.
  std::vector<float*> pointers() {
    std::vector<float*> out;
    for (auto& a : arrays) out.push_back(a.data());
    return out;
  }
  // Every array `elements` floats of zero, one per dataset.
  void assign(std::int64_t elements) {
    arrays.assign(datasets.size(), std::vector<float>(static_cast<std::size_t>(elements), 0.0f));
  }
  std::int64_t bytes() const {
    std::int64_t n = 0;
    for (const auto& a : arrays) n += static_cast<std::int64_t>(a.size());
    return n * 4;
  }
  RankState view() const {
    RankState state{
        rank, arrays.empty() ? 0 : static_cast<std::int64_t>(arrays[0].size()), datasets, {}};
    for (const auto& a : arrays) {
      state.arrays.push_back({{a.data(), static_cast<std::int64_t>(a.size()) * 4}});
    }
    return state;
  }
};

// Writes `state` to `path` (rank `state.rank` of `world`), closes it and fsyncs it. The
// datasets' bytes go through a TensorWriter (past the page cache where the file system allows,
// checksums computed while the device writes), so the final fsync waits only for HDF5's
// metadata and the device's cache.
// kill_midway (a test hook): after the first dataset is flushed, the process raises SIGKILL.
// Where a rank file's time went (seconds), for benchmarks.
struct RankFileTimings {
  double create_s = 0.0;  // create the file, reserve its blocks, root attributes
  double data_s = 0.0;    // the datasets written (the checksums included)
  double crc_s = 0.0;     // of which computing CRC-32C blocks (overlapped with the writes)
  double close_s = 0.0;   // HDF5's metadata and close
  double fsync_s = 0.0;   // until the device has it all
};
// direct_io false: the tensor data through the page cache (checkpoint.direct_io). save_id:
// the save's (CheckpointIndex::save_id; 0 writes none).
void write_rank_file(const std::string& path, const RankState& state, int world, std::uint64_t seed,
                     std::int64_t save_id, bool kill_midway = false,
                     RankFileTimings* timings = nullptr, bool direct_io = true);
inline void write_rank_file(const std::string& path, const RankSnapshot& snapshot, int world,
                            std::uint64_t seed, std::int64_t save_id = 0,
                            bool kill_midway = false) {
  write_rank_file(path, snapshot.view(), world, seed, save_id, kill_midway);
}

// Throws InvalidArgument naming the file unless `file` is rank `rank` of the checkpoint whose
// index is `index`: its format, rank and world, and (where the index has one) its save id.
void check_rank_file(const H5File& file, const CheckpointIndex& index, int rank);

// Reads the slices a rank of a (possibly different) partition plan owns from the rank files of
// the checkpoint in `dir` whose validated index is `index`. Each fill() reads only the ranges
// of the old slices that fall in the requested new slice (HDF5 hyperslabs, rounded out to the
// checksum blocks they verify). Rank files are opened on first use and checked: format, rank,
// world, dataset types and lengths against the index, before anything is read from them.
// Not thread-safe.
class ShardedReader {
 public:
  // `sources[p]`: where the plan's parameter p is in the checkpoint (found by name,
  // param_match.h); empty: the plan's parameters are the index's, in its order.
  ShardedReader(std::string dir, const CheckpointIndex& index, ParamSources sources = {});
  ~ShardedReader();
  // Writes rank `rank`'s slice of unit `u` of `plan` (plan.unit(u).shard floats each, padding
  // zero) into `out`: one array per dataset of index.state_datasets(), in that order, whatever
  // slicing wrote each unit; a null array is skipped, not read (a frozen unit's optimizer
  // state, which the engine does not hold). Where the old and new slices line up, the file's
  // bytes are read straight into the destination.
  void fill(const PartitionPlan& plan, int rank, int u, const std::vector<float*>& out);
  std::int64_t bytes_read() const { return bytes_read_; }

 private:
  struct OpenFile;
  OpenFile& file(int old_rank);
  std::string dir_;
  const CheckpointIndex& index_;
  ParamSources sources_;
  std::map<int, std::unique_ptr<OpenFile>> files_;
  std::vector<unsigned char> scratch_;
  std::vector<float> span_;
  std::int64_t bytes_read_ = 0;
};

// Checks one rank file completely (format, shapes, every checksum); returns the bytes checked.
std::int64_t verify_rank_file(const std::string& path, const CheckpointIndex& index, int rank);

}  // namespace zrt::checkpoint
