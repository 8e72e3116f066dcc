#include "train/checkpoint_policy.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "optimizers/lr_schedule.h"
#include "runtime/checkpoint/engine_state.h"

namespace zrt::train {

checkpoint::LoadPlan CheckpointPolicy::plan(const Config& config, int rank) {
  checkpoint::LoadPlan load_plan = checkpoint::plan_load(config.checkpoint);
  if (rank == 0) {
    spdlog::info("{}", load_plan.note);
    if (load_plan.clear_save_dir) checkpoint::remove_checkpoints(config.checkpoint.save_dir);
  }
  return load_plan;
}

CheckpointPolicy::CheckpointPolicy(const Config& config, int rank, Device& device,
                                   ZeroEngine& engine, DataStream& train_stream)
    : config_(config),
      rank_(rank),
      engine_(engine),
      train_stream_(train_stream),
      checkpointer_(config.checkpoint, config.comm.timeout_s, checkpoint::TestHooks::from_env()) {
  checkpointer_.set_host_allocator(checkpoint::snapshot_allocator(device, engine));
}

std::int64_t CheckpointPolicy::resume(const checkpoint::LoadPlan& plan) {
  std::int64_t start_step = 0;
  if (const auto& dir = plan.dir) {
    const checkpoint::CheckpointIndex index = checkpoint::load_engine(*dir, engine_);
    train_stream_.restore(index.data);
    // The data order is part of the stream the checkpoint continues: the saved one wins, and a
    // config that asks for another is told so (rather than silently ignored).
    const bool order_changed = index.data.shuffle != config_.data.shuffle ||
                               (index.data.shuffle && index.data.seed != config_.data.seed);
    if (rank_ == 0 && order_changed) {
      spdlog::warn(
          "{}: the run continues the saved data order (data.shuffle {}, data.seed {}); "
          "the config's (shuffle {}, seed {}) applies to a fresh start only",
          *dir, index.data.shuffle, index.data.seed, config_.data.shuffle, config_.data.seed);
    }
    start_step = index.step;
    if (index.scheduler != lr_schedule_name(config_.scheduler.type)) {
      spdlog::warn("{}: saved with scheduler {}, resuming with {}", *dir, index.scheduler,
                   lr_schedule_name(config_.scheduler.type));
    }
    if (rank_ == 0) {
      spdlog::info("resumed from {} at step {} (saved by {} rank(s) at ZeRO stage {})", *dir,
                   index.step, index.world, index.stage);
    }
  }
  last_save_ = Clock::now();  // checkpoint.save_interval_minutes counts from here
  return start_step;
}

bool CheckpointPolicy::time_vote() const {
  return rank_ == 0 && config_.checkpoint.save_interval_minutes > 0.0 &&
         std::chrono::duration<double>(Clock::now() - last_save_).count() >=
             60.0 * config_.checkpoint.save_interval_minutes;
}

bool CheckpointPolicy::due(std::int64_t step, bool timed_save) const {
  const bool interval_save =
      config_.checkpoint.save_interval > 0 &&
      (step % config_.checkpoint.save_interval == 0 || step == config_.train.steps);
  const bool last_save_due = config_.checkpoint.saves() && step == config_.train.steps;
  return interval_save || last_save_due || timed_save;
}

void CheckpointPolicy::save_checkpoint(std::int64_t step, bool synchronous) {
  engine_.settle_step();  // the counters it saves count the step's decision
  checkpoint::SaveRequest request;
  request.tag = checkpoint::Checkpointer::tag_for_step(step);
  request.synchronous = synchronous;
  request.index.step = step;
  request.index.seed = config_.seed;
  request.index.data = train_stream_.state();
  request.index.scheduler = lr_schedule_name(config_.scheduler.type);
  request.index.config_json = config_.document.dump();
  checkpoint::describe_engine(engine_, request.index);
  // Every rank of the partition writes its slices (at stage 0 the one full copy, rank 0's).
  // A sync save writes them from where the engine keeps them when that is host memory, and
  // copies them here otherwise (a GPU); an async one only issues the copy (the engine's next
  // step waits for it on its stream) and the writer thread waits for it.
  checkpointer_.save(
      std::move(request),
      [&](const std::vector<float*>& arrays) { checkpoint::snapshot_engine(engine_, arrays); },
      [&](const std::vector<float*>& arrays) {
        return checkpoint::snapshot_engine_async(engine_, arrays,
                                                 checkpointer_.hooks().copy_delay_ms);
      },
      [&] { return checkpoint::engine_state_view(engine_); });
}

bool CheckpointPolicy::tolerate_save_error(const Error& e) {
  // A rank lost or hung (Timeout) is not a storage fault: the run cannot go on.
  if (config_.checkpoint.stop_on_save_error || dynamic_cast<const Timeout*>(&e) != nullptr) {
    return false;
  }
  ++saves_failed_;
  if (rank_ == 0) {
    const auto latest = checkpoint::read_latest(config_.checkpoint.save_dir);
    spdlog::error("{}; training goes on (checkpoint.on_save_error \"continue\"), latest is {}",
                  e.what(), latest ? *latest : std::string("(none)"));
  }
  return true;
}

bool CheckpointPolicy::wait() {
  try {
    checkpointer_.wait();
    return true;
  } catch (const Error& e) {
    if (!tolerate_save_error(e)) throw;
    return false;
  }
}

bool CheckpointPolicy::save(std::int64_t step, bool wait_for_it) {
  wait();  // an earlier async save's error is reported (or thrown) on its own
  bool ok = true;
  try {
    // A save waited for (a preemption's) is written synchronously: no snapshot copy first.
    save_checkpoint(step, /*synchronous=*/wait_for_it);
  } catch (const Error& e) {
    // save() first waits for the previous async save: its error may be the one caught here.
    if (!tolerate_save_error(e)) throw;
    ok = false;
  }
  last_save_ = Clock::now();
  if (wait_for_it) ok = wait() && ok;
  return ok;
}

RunStatus CheckpointPolicy::save_for_stop(std::int64_t step) {
  const auto t = Clock::now();
  const bool saved = save(step, /*wait=*/true);
  if (rank_ == 0 && saved) {
    spdlog::warn(
        "preempted at step {}: checkpoint {} saved in {:.2f} s; resume with "
        "checkpoint.load \"auto\"",
        step, checkpoint::Checkpointer::tag_for_step(step),
        std::chrono::duration<double>(Clock::now() - t).count());
  }
  // A stop at the last step is a finished run (nothing to requeue).
  return !saved                        ? RunStatus::kPreemptedUnsaved
         : step == config_.train.steps ? RunStatus::kCompleted
                                       : RunStatus::kPreempted;
}

}  // namespace zrt::train
