// Checkpointer: the commit protocol of sharded checkpoints (docs/checkpoints.md), synchronous or
// on a background writer thread.
//
// save(), on every rank (collective):
//   1. rank 0 creates <save_dir>/<tag>.tmp/ and a probe file in it holding a random nonce; every
//      rank must then read the probe with that nonce (a multi-node save needs a shared file
//      system; a rank that cannot see the file fails the save, naming the directory);
//   2. each rank that holds slices to write writes rank_XXXXX.h5 there, closes and fsyncs it;
//      rank 0 also writes and fsyncs index.h5 (an engine over several groups: first gathering
//      every rank's table rows into it, rank_share.h); an all-reduce of an ok flag (a barrier
//      carries no status) tells every rank whether all succeeded;
//   3. rank 0 fsyncs the directory, renames it to <tag>, fsyncs <save_dir>, writes
//      <save_dir>/latest (temp file, fsync, rename, fsync <save_dir>); a last all-reduce makes
//      every rank's save() succeed or throw together. Only then, on a thread of rank 0's that
//      the next save or wait() joins, the checkpoints beyond keep_last (and abandoned *.tmp
//      directories of earlier saves) are deleted.
// A reader trusts only what `latest` names, so a save killed at any moment leaves the previous
// checkpoint loadable.
//
// The snapshot: save(request, fill) copies this rank's state (fill) into a host buffer the
// checkpointer allocates on first use (set_host_allocator: pinned memory when the state is on a
// GPU) and reuses for every later save, so a save costs a copy, not a fresh allocation whose
// page faults would stall training. The buffer is only refilled after the previous save has
// finished writing it.
//
// Async with an issuer (save(request, fill, issue)): the training thread only issues the copy
// into the buffer (the engine copies on a stream of its own and keeps its state unchanged until
// the copy is done, see ZeroEngine::copy_state_out_async); the writer thread waits for the copy,
// then writes. Without an issuer, or for a sync save, fill copies on the calling thread.
//
// Async: save() takes the snapshot and returns; the files are written on the writer thread,
// whose all-reduces use their own duplicated communicator. A failure is logged at once by the
// writer thread (the tag, the file and the reason); the next save(), wait() or the destructor
// waits for the thread, and save() and wait() rethrow its error.
//
// Thread-safety: one thread calls the public methods.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/checkpoint/checkpoint_options.h"
#include "runtime/checkpoint/layout.h"
#include "runtime/checkpoint/rank_file.h"

namespace zrt::checkpoint {

// Test hooks, read from the environment by from_env() (never set them in production):
//   ZRT_TEST_CKPT_KILL_RANK=r  rank r raises SIGKILL midway through writing its rank file;
//   ZRT_TEST_CKPT_PROBE_RANK=r rank r looks for the shared-filesystem probe in a wrong directory;
//   ZRT_TEST_CKPT_UNWRITABLE_RANK=r rank r's start-up write probe of save_dir is denied (EACCES);
//   ZRT_TEST_CKPT_COPY_DELAY_MS=t an async save's state copy starts t ms late (on its stream), so
//                              the next optimizer step must wait for it;
//   ZRT_TEST_CKPT_WRITE_DELAY_MS=t every rank sleeps t ms before writing its file (a slow
//                              storage system: a save that outlasts a preemption's grace);
//   ZRT_TEST_CKPT_WRITE_DELAY_STEP=s only the save of step s is delayed (default: every save).
struct TestHooks {
  int kill_rank = -1;
  int probe_elsewhere_rank = -1;
  int unwritable_rank = -1;
  int copy_delay_ms = -1;
  int write_delay_ms = -1;
  int write_delay_step = -1;  // -1: every save
  static TestHooks from_env();
};

// One checkpoint to write: the index (rank 0's; index.share this rank's part) and, for
// save(request) without a filler, this rank's snapshot (empty when the rank owns no slice: ranks
// >= index.world).
struct SaveRequest {
  std::string tag;
  CheckpointIndex index;
  RankSnapshot snapshot;
  // Written before save() returns even when checkpoint.async (a preemption's last save).
  bool synchronous = false;
};

// Copies this rank's whole state into host arrays of index.share.held floats each (without a
// share: index.slice_elements()), one per dataset of index.state_datasets() (master, then the
// optimizer's states); the file gets the ranges index.share.written of them.
using SnapshotFiller = std::function<void(const std::vector<float*>& arrays)>;
// Issues the copy of this rank's state into the host arrays (the same as a SnapshotFiller's)
// and returns at once; the function it returns blocks until the copy is done and is called on
// the writer thread.
using SnapshotIssuer = std::function<std::function<void()>(const std::vector<float*>& arrays)>;
// This rank's state where it already is in host memory, for a synchronous save to write with no
// snapshot copy: per dataset of index.state_datasets(), the runs of host memory that hold its
// whole state (index.share.held floats), in order (one per unit). Empty where the state is
// elsewhere (a GPU's memory): the save then copies it into the snapshot buffer with the filler.
using StateView = std::function<std::vector<std::vector<HostBytes>>()>;
// Allocates `bytes` of host memory for the snapshot buffer (kept until the checkpointer goes).
using HostAllocator = std::function<std::shared_ptr<void>(std::int64_t bytes)>;

struct SaveTimings {
  double prepare_s = 0.0;  // the directory and the shared-file-system probe (two agreements)
  double write_s = 0.0;    // this rank's file: create, write, close, fsync (and rank 0's index)
  RankFileTimings file;    // write_s's rank file, by phase
  double agree_s = 0.0;    // waiting for every rank's files (the ok-flag all-reduce)
  double rename_s = 0.0;   // rank 0: fsync, rename, latest (0 elsewhere)
  double prune_s = 0.0;    // rank 0: waiting for the previous save's keep_last deletions
  double commit_s = 0.0;   // the whole protocol
  std::int64_t bytes = 0;
};

class Checkpointer {
 public:
  // Collective over `ranks` (duplicates it): every rank of the run, each rank file named by its
  // rank there. timeout_s bounds every agreement.
  Checkpointer(const CheckpointConfig& config, double timeout_s, TestHooks hooks = {},
               MPI_Comm ranks = MPI_COMM_WORLD);
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // The tag of a step's checkpoint: "global_step<step>" (DeepSpeed's naming).
  static std::string tag_for_step(std::int64_t step);

  // The snapshot buffer's allocator (default: pageable host memory). Before the first save.
  void set_host_allocator(HostAllocator allocate) { allocate_ = std::move(allocate); }

  // Saves this rank's state (collective): waits for the previous save, fills the reused
  // snapshot buffer (on ranks < index.world), then writes it, on the writer thread when async.
  // With `issue`, an async save issues the copy instead of filling (see above). A synchronous
  // save (not checkpoint.async, or request.synchronous) writes straight from the memory `view`
  // names when it names any (the state cannot change while save() runs), and otherwise fills.
  void save(SaveRequest request, const SnapshotFiller& fill, const SnapshotIssuer& issue = {},
            const StateView& view = {});
  // Saves request.snapshot, which the request owns (tools, tests). Waits for the previous save.
  void save(SaveRequest request);
  // Waits for a pending async save; rethrows its error. Returns its timings.
  SaveTimings wait();
  SaveTimings last_timings() const { return timings_; }
  const TestHooks& hooks() const { return hooks_; }

  // checkpoint.load resolved (plan_load in load_plan.h): none for a fresh start; the directory
  // of the checkpoint otherwise. Throws naming the path if a named tag (or the tag in `latest`)
  // has no complete checkpoint, or if a fresh start would save over existing checkpoints.
  std::optional<std::string> resolve_load() const;

 private:
  // `copied`, if set, blocks until the snapshot buffer is filled (run first by the writer).
  void start(SaveRequest request, const RankState& state, std::function<void()> copied = {});
  // copy_error: the snapshot copy failed on this rank (the save fails on every rank).
  void commit(const SaveRequest& request, const RankState& state,
              const std::string& copy_error = "");
  // Polls `request` until done; past the timeout throws Timeout naming `what`.
  void wait_for(MPI_Request& request, const std::string& what);
  // All-reduce (max) of `values` on the writer's communicator, polled with a timeout.
  // `what`: the tag and stage, for the timeout's message.
  std::vector<std::int64_t> agree(std::vector<std::int64_t> values, const std::string& what);
  // Several groups: rank 0's index with the tables of every rank's share (gathered); other
  // ranks get `index` back. Sets *error on rank 0 when the rows do not fit together.
  CheckpointIndex gather_tables(const CheckpointIndex& index, std::string* error);
  // Every rank learns whether any failed; throws on all if one did, each with the reason of the
  // highest failing rank.
  void check_all(const std::string& stage, const std::string& tag, const std::string& local_error);
  // `root`'s `text` on every rank (a failure's reason), polled with the timeout.
  std::string broadcast_text(const std::string& text, int root);
  void prune(std::int64_t keep_step);

  CheckpointConfig config_;
  double timeout_s_;
  TestHooks hooks_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int world_ = 1;
  HostAllocator allocate_;
  std::shared_ptr<void> snapshot_;  // the reused snapshot buffer: master, then each state
  std::int64_t snapshot_bytes_ = 0;
  std::thread writer_;
  std::thread pruner_;  // rank 0: keep_last deletions after a commit (joined by wait())
  std::exception_ptr error_;
  SaveTimings timings_;
};

// Reads <save_dir>/latest: the tag, or none if the file does not exist.
std::optional<std::string> read_latest(const std::string& save_dir);

}  // namespace zrt::checkpoint
