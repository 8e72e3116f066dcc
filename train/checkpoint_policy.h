// CheckpointPolicy: when and how a run checkpoints. What checkpoint.load means (decided before
// anything is built, so a run that would overwrite another run's checkpoints stops at once),
// the resume, the periodic saves (checkpoint.save_interval steps, the last step, the wall-clock
// checkpoint.save_interval_minutes), the synchronous save of a stop request (preemption), and
// checkpoint.on_save_error: a failed save ends the run ("stop") or is logged and counted while
// training goes on ("continue"); either way `latest` still names the previous checkpoint.
// One per rank; every call but time_vote() is collective over the ranks. Not thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>

#include "config/config.h"
#include "runtime/checkpoint/checkpointer.h"
#include "runtime/checkpoint/load_plan.h"
#include "runtime/checkpoint/save_dir_lock.h"
#include "runtime/common/error.h"
#include "runtime/data/data_stream.h"
#include "runtime/device/device.h"
#include "runtime/engine/zero_engine.h"
#include "train/trainer.h"

namespace zrt::train {

class CheckpointPolicy {
 public:
  // What checkpoint.load means for save_dir as it is now (runtime/checkpoint/load_plan.h),
  // decided by rank 0 (which logs it and clears save_dir when the plan says so) and taken by
  // every rank; each checks it can see the checkpoint. Collective over MPI_COMM_WORLD; a
  // refusal throws InvalidArgument on every rank.
  // `lock` (may be null): where rank 0 of a job that saves keeps save_dir's lock for the run
  // (runtime/checkpoint/save_dir_lock.h); another job holding it is refused here.
  static checkpoint::LoadPlan plan(const Config& config, int rank,
                                   checkpoint::SaveDirLock* lock = nullptr);

  // Saves `engine` and `train_stream`'s position as config.checkpoint says.
  CheckpointPolicy(const Config& config, int rank, Device& device, ZeroEngine& engine,
                   DataStream& train_stream);

  // Loads plan.dir (at any world size or stage) into the engine and the data stream, if the plan
  // names one; returns its step (0: a fresh start). The wall-clock interval counts from here.
  std::int64_t resume(const checkpoint::LoadPlan& plan);

  // This rank's vote for a wall-clock save at this step boundary: only rank 0's clock votes, so
  // every rank agrees however their clocks drift. Not collective.
  bool time_vote() const;
  // Whether step `step` is saved after training it (save_interval, the last step, or the
  // agreed wall-clock vote `timed_save`), when no stop was requested.
  bool due(std::int64_t step, bool timed_save) const;

  // Saves step `step` (async unless `wait`; with `wait`, waits for it to commit). False if a
  // save failed and checkpoint.on_save_error "continue" tolerated it; throws otherwise. The
  // wall-clock interval counts from here.
  bool save(std::int64_t step, bool wait_for_it);
  // Waits for an async save; its error is tolerated (false) or thrown as save() says.
  bool wait();
  // The save of a stop request at step `step`: synchronous (the previous save finishes first,
  // then this step's checkpoint is committed). Returns how the run ended.
  RunStatus save_for_stop(std::int64_t step);

  // Rank 0: whether resume() took a checkpoint older than others in save_dir (another
  // timeline's later tags are there).
  bool resumed_before_newest() const { return resumed_before_newest_; }

  // Saves that failed under checkpoint.on_save_error "continue".
  std::int64_t saves_failed() const { return saves_failed_; }
  // Whether the run saves, a save failed under "continue", and step `step`'s save did not
  // commit: the state the run ended with is in no checkpoint. Every rank answers alike (a
  // save's success is agreed by all ranks). After wait().
  bool ended_unsaved(std::int64_t step) const;

 private:
  using Clock = std::chrono::steady_clock;

  void save_checkpoint(std::int64_t step, bool synchronous);
  void warn_of_later_checkpoints(std::int64_t step);
  // `counts_recorded`: the index holds every parameter's own Adam step count (param_steps).
  void warn_of_model_changes(const std::string& dir, const std::string& saved_config,
                             bool counts_recorded) const;
  // True if `e` (a failed save, the same on every rank) is tolerated: counted and logged.
  bool tolerate_save_error(const Error& e);

  const Config& config_;
  const int rank_;
  ZeroEngine& engine_;
  DataStream& train_stream_;
  checkpoint::Checkpointer checkpointer_;
  Clock::time_point last_save_ = Clock::now();
  std::int64_t saves_failed_ = 0;
  std::int64_t saving_step_ = 0;  // the step of the save issued last (its error may come later)
  // The step of the save issued last while it has not yet reported (an async one writes on).
  std::optional<std::int64_t> pending_step_;
  std::int64_t last_committed_step_ = -1;  // the step of the last save every rank committed
  bool resumed_before_newest_ = false;
  bool stopping_ = false;  // save_for_stop() was called: no training follows a failed save
};

}  // namespace zrt::train
