// Checkpointer: the commit protocol of sharded checkpoints (docs/checkpoints.md), synchronous or
// on a background writer thread.
//
// save(), on every rank (collective):
//   1. rank 0 creates <save_dir>/<tag>.tmp/ and a probe file in it holding a random nonce; every
//      rank must then read the probe with that nonce (a multi-node save needs a shared file
//      system; a rank that cannot see the file fails the save, naming the directory);
//   2. each rank of the partition writes rank_XXXXX.h5 there, closes and fsyncs it; rank 0 also
//      writes and fsyncs index.h5; an all-reduce of an ok flag (a barrier carries no status)
//      tells every rank whether all succeeded;
//   3. rank 0 fsyncs the directory, renames it to <tag>, fsyncs <save_dir>, writes
//      <save_dir>/latest (temp file, fsync, rename, fsync <save_dir>), and only then deletes the
//      checkpoints beyond keep_last (and abandoned *.tmp directories of earlier saves); a last
//      all-reduce makes every rank's save() succeed or throw together.
// A reader trusts only what `latest` names, so a save killed at any moment leaves the previous
// checkpoint loadable.
//
// Async: save() takes the snapshot (host memory) from the caller and returns; the files are
// written on the writer thread, whose all-reduces use their own duplicated communicator. The
// next save(), wait() or the destructor waits for it; wait() rethrows its error.
//
// Thread-safety: one thread calls the public methods.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/checkpoint/layout.h"
#include "runtime/checkpoint/rank_file.h"
#include "runtime/config/config.h"

namespace zrt::checkpoint {

// Test hooks, read from the environment by from_env() (never set them in production):
//   ZRT_TEST_CKPT_KILL_RANK=r  rank r raises SIGKILL midway through writing its rank file;
//   ZRT_TEST_CKPT_PROBE_RANK=r rank r looks for the shared-filesystem probe in a wrong directory.
struct TestHooks {
  int kill_rank = -1;
  int probe_elsewhere_rank = -1;
  static TestHooks from_env();
};

// One checkpoint to write: the index (rank 0's) and this rank's snapshot (empty when the rank
// owns no slice: ranks >= index.world).
struct SaveRequest {
  std::string tag;
  CheckpointIndex index;
  RankSnapshot snapshot;
};

struct SaveTimings {
  double write_s = 0.0;   // this rank's file: create, write, close, fsync
  double commit_s = 0.0;  // the whole protocol
  std::int64_t bytes = 0;
};

class Checkpointer {
 public:
  // Collective over MPI_COMM_WORLD (duplicates it). timeout_s bounds every agreement.
  Checkpointer(const CheckpointConfig& config, double timeout_s, TestHooks hooks = {});
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // The tag of a step's checkpoint: "global_step<step>" (DeepSpeed's naming).
  static std::string tag_for_step(std::int64_t step);

  // Saves (collective). Waits for the previous async save first.
  void save(SaveRequest request);
  // Waits for a pending async save; rethrows its error. Returns its timings.
  SaveTimings wait();
  SaveTimings last_timings() const { return timings_; }

  // checkpoint.load resolved: none for "" or for "latest" without a `latest` file; the
  // directory of the checkpoint otherwise. Throws naming the path if a named tag (or the tag in
  // `latest`) has no complete checkpoint.
  std::optional<std::string> resolve_load() const;

 private:
  void commit(const SaveRequest& request);
  // All-reduce (max) of `values` on the writer's communicator, polled with a timeout.
  std::vector<std::int64_t> agree(std::vector<std::int64_t> values);
  // Every rank learns whether any failed; throws on all if one did.
  void check_all(const std::string& stage, const std::string& tag, const std::string& local_error);
  void prune(std::int64_t keep_step);

  CheckpointConfig config_;
  double timeout_s_;
  TestHooks hooks_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int world_ = 1;
  std::thread writer_;
  std::exception_ptr error_;
  SaveTimings timings_;
};

// Reads <save_dir>/latest: the tag, or none if the file does not exist.
std::optional<std::string> read_latest(const std::string& save_dir);

}  // namespace zrt::checkpoint
