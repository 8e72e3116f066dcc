#include "train/checkpoint_policy.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <mpi.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "optimizers/lr_schedule.h"
#include "runtime/checkpoint/checkpointer.h"
#include "runtime/checkpoint/engine_state.h"
#include "runtime/checkpoint/load_plan.h"
#include "runtime/comm/mpi_runtime.h"
#include "runtime/data/data_fingerprint.h"

namespace zrt::train {

namespace fs = std::filesystem;

namespace {

// "4 ranks at ZeRO stage 2", with the sequence- and expert-parallel degrees where above 1.
std::string describe_layout(int world, int stage, int sp, int ep) {
  std::string text = fmt::format("{} rank{} at ZeRO stage {}", world, world == 1 ? "" : "s", stage);
  if (sp > 1) text += fmt::format(", sequence_parallel_size {}", sp);
  if (ep > 1) text += fmt::format(", expert_parallel.autoep_size {}", ep);
  return text;
}

// An integer of a checkpoint's saved config block (the run's document as written), 1 where it is
// unset (the default) or not an integer: the parallel degrees the checkpoint was saved at.
int saved_degree(const nlohmann::json& block, const char* key) {
  if (!block.is_object()) return 1;
  const auto it = block.find(key);
  return it != block.end() && it->is_number_integer() ? it->get<int>() : 1;
}

// The plan's collectives run before any group (and its watchdog) exists, so each is
// nonblocking and polled with comm.timeout_s: a rank that dies or hangs here (rank 0 stuck on
// the save directory's file system) ends the others with a Timeout naming the stage, never a
// hang.
void wait_for(MPI_Request& request, double timeout_s, const char* what) {
  wait_mpi_request(request, {timeout_s, PollPace::kBackoff, nullptr}, [&] {
    return fmt::format(
        "checkpoint.load: {} within comm.timeout_s {} s (a rank died or hangs, "
        "or rank 0 is stuck on checkpoint.save_dir's file system)",
        what, timeout_s);
  });
}

// `root`'s text on every rank of MPI_COMM_WORLD.
std::string broadcast_text(std::string text, int root, double timeout_s, const char* what) {
  std::int64_t length = static_cast<std::int64_t>(text.size());
  MPI_Request request;
  ZRT_MPI_CHECK(MPI_Ibcast(&length, 1, MPI_INT64_T, root, MPI_COMM_WORLD, &request));
  wait_for(request, timeout_s, what);
  text.resize(static_cast<std::size_t>(length));
  if (length > 0) {
    ZRT_MPI_CHECK(MPI_Ibcast(text.data(), static_cast<int>(length), MPI_CHAR, root, MPI_COMM_WORLD,
                             &request));
    wait_for(request, timeout_s, what);
  }
  return text;
}

std::string broadcast_from_rank0(std::string text, double timeout_s) {
  return broadcast_text(std::move(text), 0, timeout_s, "rank 0's decision did not arrive");
}

// The lowest rank for which `failed` holds (all ranks learn it), or -1 if none.
int first_rank_where(bool failed, int rank, double timeout_s, const char* what) {
  int mine = failed ? rank : std::numeric_limits<int>::max();
  int first = mine;
  MPI_Request request;
  ZRT_MPI_CHECK(MPI_Iallreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD, &request));
  wait_for(request, timeout_s, what);
  return first == std::numeric_limits<int>::max() ? -1 : first;
}

// Every rank probes save_dir for a file of its own: a save makes every rank write there, so
// one rank that cannot (a node whose mount is read-only, another user's directory on one host)
// fails every save. Returns whether this rank can write; throws InvalidArgument on every rank
// under checkpoint.on_save_error "stop" (the first save would end the run after training up to
// it), naming the first rank that cannot and its reason; under "continue" rank 0 warns.
bool check_save_dir_writable(const Config& config, int rank) {
  const std::string& dir = config.checkpoint.save_dir;
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "host");
  const std::string who = fmt::format("{}-{}-rank{}", host, ::getpid(), rank);
  const bool denied = rank == checkpoint::TestHooks::from_env().unwritable_rank;
  const std::string reason = checkpoint::why_not_writable(dir, who, denied);
  const double timeout_s = config.comm.timeout_s;
  const int first = first_rank_where(!reason.empty(), rank, timeout_s,
                                     "the ranks did not agree checkpoint.save_dir can be written");
  if (first < 0) return true;
  const std::string first_reason =
      broadcast_text(reason, first, timeout_s, "the unwritable rank's reason did not arrive");
  if (config.checkpoint.stop_on_save_error) {
    ZRT_THROW(InvalidArgument,
              "checkpoint.save_dir {} cannot be written (rank {}: {}): the first save would end "
              "the run after training up to it; every rank writes its part of a checkpoint "
              "there. Fix it, or set checkpoint.on_save_error \"continue\" to train on without "
              "checkpoints",
              dir, first, first_reason);
  }
  if (rank == 0) {
    spdlog::warn(
        "checkpoint.save_dir {} cannot be written (rank {}: {}): every save will fail and be "
        "logged (checkpoint.on_save_error \"continue\"), and a run whose last save fails ends "
        "in an error",
        dir, first, first_reason);
  }
  return reason.empty();
}

}  // namespace

// Rank 0 reads the save directory and decides; every rank takes its decision. Ranks reading
// `latest` each on their own could resume from different steps (node-local copies of the
// directory), and rank 0 clearing it for a fresh start raced the others' reads. Collective over
// MPI_COMM_WORLD, before any group exists.
checkpoint::LoadPlan CheckpointPolicy::plan(const Config& config, int rank,
                                            checkpoint::SaveDirLock* lock) {
  checkpoint::LoadPlan load_plan;
  // A job that saves: every rank must be able to write save_dir (refused here under "stop").
  const bool writable = !config.checkpoint.saves() || check_save_dir_writable(config, rank);
  std::string error;
  if (rank == 0) {
    try {
      // Then the directory's lock: another job in it is refused before anything of its is
      // read. (Under "continue", a directory rank 0 cannot write has no lock file either.)
      if (lock != nullptr && config.checkpoint.saves() && writable) {
        *lock = checkpoint::SaveDirLock(config.checkpoint.save_dir);
      }
      load_plan = checkpoint::plan_load(config.checkpoint);
      spdlog::info("{}", load_plan.note);
      if (load_plan.clear_save_dir) checkpoint::remove_checkpoints(config.checkpoint.save_dir);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  const double timeout_s = config.comm.timeout_s;
  error = broadcast_from_rank0(error, timeout_s);
  if (!error.empty()) throw InvalidArgument(error);
  const std::string dir = broadcast_from_rank0(load_plan.dir.value_or(std::string()), timeout_s);
  if (dir.empty()) {
    load_plan.dir.reset();
    return load_plan;
  }
  load_plan.dir = dir;
  // Every rank reads the checkpoint: the first that cannot see it is named on all of them. (The
  // test hook ZRT_TEST_CKPT_PROBE_RANK makes one rank look elsewhere, as for the save's probe.)
  const bool elsewhere = rank == checkpoint::TestHooks::from_env().probe_elsewhere_rank;
  const fs::path seen = elsewhere ? fs::path(dir + "_not_shared") : fs::path(dir);
  const int blind = first_rank_where(!fs::exists(seen / "index.h5"), rank, timeout_s,
                                     "the ranks did not agree they see the checkpoint");
  if (blind >= 0) {
    throw InvalidArgument(fmt::format(
        "checkpoint {} (rank 0 resumes from it): rank {} cannot see its index.h5; every rank "
        "reads the checkpoint, so checkpoint.save_dir must be on a file system all ranks share",
        dir, blind));
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
    const checkpoint::CheckpointIndex index =
        checkpoint::load_engine(*dir, engine_, MPI_COMM_WORLD, config_.comm.timeout_s);
    train_stream_.restore(index.data);
    // Files of the same sample count pass the restore; the fingerprint tells other files apart.
    if (rank_ == 0 && !index.data.fingerprint.empty()) {
      const std::string change =
          describe_fingerprint_change(index.data.fingerprint, train_stream_.fingerprint());
      if (!change.empty()) {
        spdlog::warn(
            "{}: data.train ({}) is not the data this checkpoint was saved with: {}. The run "
            "continues from the saved sample index in the data as it is now",
            *dir, train_stream_.dataset().pattern(), change);
      }
    }
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
    const double static_scale = config_.engine.loss_scale.loss_scale;
    if (rank_ == 0 && config_.fp16() && static_scale > 0.0 &&
        index.loss_scale.scale != static_scale) {
      spdlog::info("{}: saved with loss scale {}; the config's static fp16.loss_scale {} applies",
                   *dir, index.loss_scale.scale, static_scale);
    }
    start_step = index.step;
    warn_of_later_checkpoints(start_step);
    const bool counts_recorded =
        std::all_of(index.params.begin(), index.params.end(),
                    [](const checkpoint::ParamEntry& e) { return e.steps >= 0; });
    warn_of_model_changes(*dir, index.config_json, counts_recorded);
    if (index.scheduler != lr_schedule_name(config_.scheduler.type)) {
      spdlog::warn("{}: saved with scheduler {}, resuming with {}", *dir, index.scheduler,
                   lr_schedule_name(config_.scheduler.type));
    }
    if (rank_ == 0) {
      // The layout the checkpoint was saved at, and this run's where it differs: a resume at
      // another world size, stage, sequence- or expert-parallel degree reshards, and the log
      // says so instead of leaving the user to compare configs.
      const nlohmann::json saved = nlohmann::json::parse(index.config_json, nullptr, false);
      // autoep_size counts only with expert_parallel.enabled, as the parser reads it.
      const nlohmann::json ep = saved.is_object()
                                    ? saved.value("expert_parallel", nlohmann::json::object())
                                    : nlohmann::json::object();
      const bool ep_on = ep.is_object() && ep.value("enabled", false);
      const std::string then =
          describe_layout(index.world, index.stage, saved_degree(saved, "sequence_parallel_size"),
                          ep_on ? saved_degree(ep, "autoep_size") : 1);
      const std::string now = describe_layout(config_.batch.world_size, config_.engine.stage,
                                              config_.engine.sequence_parallel_size,
                                              config_.engine.expert_parallel_size);
      spdlog::info("resumed from {} at step {} (saved by {}{})", *dir, index.step, then,
                   now == then ? "" : ", resharded for " + now);
    }
  }
  last_save_ = Clock::now();  // checkpoint.save_interval_minutes counts from here
  return start_step;
}

// Resuming from an older tag: the checkpoints past it are another timeline's. They stay (this
// run's pruning neither counts nor removes them), and `latest` will name this run's saves.
void CheckpointPolicy::warn_of_later_checkpoints(std::int64_t step) {
  if (rank_ != 0) return;
  std::vector<std::string> later;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(config_.checkpoint.save_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory(ec) && checkpoint::step_of_tag(name) > step) later.push_back(name);
  }
  resumed_before_newest_ = !later.empty();
  if (later.empty()) return;
  std::sort(later.begin(), later.end());
  spdlog::warn(
      "{}: {} checkpoint(s) past the resumed step {} ({}) are another run's timeline: "
      "they are kept until this run saves a step of the same number (which replaces it), are "
      "not counted by keep_last, and the next save's `latest` names this run's (remove them, "
      "or resume from the newest, if that is what was meant)",
      config_.checkpoint.save_dir, later.size(), step, fmt::join(later, ", "));
}

// The shapes are checked against the checkpoint's as it loads; a model key that changes no
// shape (heads at the same width, rope_theta, a norm's epsilon, routing settings) trains the
// saved weights as another model. Deliberate at times (a longer context's rope_theta), so a
// warning naming each key, with both values.
void CheckpointPolicy::warn_of_model_changes(const std::string& dir,
                                             const std::string& saved_config,
                                             bool counts_recorded) const {
  if (rank_ != 0 || saved_config.empty()) return;
  const nlohmann::json saved = nlohmann::json::parse(saved_config, nullptr, false);
  if (saved.is_discarded() || !saved.is_object()) return;
  // The global batch: the data stream continues from the saved sample index whatever it is,
  // but the steps then take another number of samples (and the schedule's steps mean others).
  if (saved.contains("train_batch_size") && saved["train_batch_size"].is_number_integer() &&
      saved["train_batch_size"].get<std::int64_t>() != config_.batch.train_batch_size) {
    spdlog::warn(
        "{}: saved by a run with train_batch_size {}, resumed with {}: the data continues "
        "from the saved sample, each step now takes {} sequences",
        dir, saved["train_batch_size"].get<std::int64_t>(), config_.batch.train_batch_size,
        config_.batch.train_batch_size);
  }
  // The data: the stream continues from the saved sample index of whatever data.train names
  // now (the sample count is checked, and the files' fingerprint in resume()).
  const nlohmann::json saved_data = saved.value("data", nlohmann::json::object());
  const nlohmann::json data_now = config_.document.value("data", nlohmann::json::object());
  for (const char* key : {"train", "document_mask", "document_separator"}) {
    const std::string was = saved_data.contains(key) ? saved_data[key].dump() : "(unset)";
    const std::string is = data_now.contains(key) ? data_now[key].dump() : "(unset)";
    if (was != is) {
      spdlog::warn(
          "{}: data.{} was {} when saved, is {} now: the run continues from the saved "
          "sample index in the data as configured now",
          dir, key, was, is);
    }
  }
  if (!saved.contains("model") || !saved["model"].is_object()) return;
  const nlohmann::json& before = saved["model"];
  const nlohmann::json now = config_.document.value("model", nlohmann::json::object());
  std::vector<std::string> changed;
  auto value_of = [](const nlohmann::json& block, const std::string& key) {
    return block.contains(key) ? block[key].dump() : std::string("(unset)");
  };
  std::vector<std::string> keys;
  for (const auto& item : before.items()) keys.push_back(item.key());
  for (const auto& item : now.items()) {
    if (!before.contains(item.key())) keys.push_back(item.key());
  }
  // init_from is saved absolute (save_checkpoint): compared as paths.
  auto absolute_path = [](const nlohmann::json& block) {
    if (!block.contains("init_from") || !block["init_from"].is_string()) return std::string();
    std::error_code ec;
    const fs::path p = fs::absolute(block["init_from"].get<std::string>(), ec);
    return ec ? std::string() : p.lexically_normal().string();
  };
  for (const std::string& key : keys) {
    if (key == "init_from" && absolute_path(before) == absolute_path(now)) continue;
    const std::string was = value_of(before, key), is = value_of(now, key);
    if (was != is) changed.push_back(fmt::format("model.{} {} -> {}", key, was, is));
  }
  if (changed.empty()) return;
  // A parameter frozen when saved has no optimizer state; trained now, Adam starts it from zero
  // and counts its own steps from there (the checkpoint's param_steps, as PyTorch's
  // per-parameter step).
  const bool frozen_changed = value_of(before, "frozen") != value_of(now, "frozen") ||
                              value_of(before, "trainable") != value_of(now, "trainable");
  spdlog::warn(
      "{}: the model block differs from the one this checkpoint was saved with ({}); "
      "the shapes match, so the saved weights train as the model configured now{}",
      dir, fmt::join(changed, "; "),
      !frozen_changed ? ""
      : counts_recorded
          ? " (a parameter frozen then and trained now starts its optimizer state at zero and "
            "counts its Adam steps from there; one trained then and frozen now keeps its saved "
            "value)"
          : " (a parameter frozen then and trained now starts its optimizer state at zero at "
            "the run's step count: this checkpoint predates the per-parameter counts, so "
            "Adam's first updates of it are larger than lr, about 3x late in a run; one "
            "trained then and frozen now keeps its saved value)");
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
  // Rank 0 writes the index: it alone reads the files' ends (once per run), not every rank of
  // a large job on a shared file system.
  if (rank_ == 0) request.index.data.fingerprint = train_stream_.fingerprint();
  request.index.scheduler = lr_schedule_name(config_.scheduler.type);
  // The run's config as written, but model.init_from made absolute: zrt-ckpt export and a
  // resume rebuild the model from it, perhaps from another working directory.
  nlohmann::json saved = config_.document;
  if (saved.contains("model") && saved["model"].is_object() &&
      saved["model"].contains("init_from") && saved["model"]["init_from"].is_string()) {
    std::error_code ec;
    const fs::path from = fs::absolute(saved["model"]["init_from"].get<std::string>(), ec);
    if (!ec) saved["model"]["init_from"] = from.lexically_normal().string();
  }
  request.index.config_json = saved.dump();
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
    // The last step's save has no training after it to go on with: the run ends in an error;
    // a stop request's save ends the run unsaved.
    const char* after = stopping_                             ? "the run stops unsaved"
                        : saving_step_ == config_.train.steps ? "that was the run's last step"
                                                              : "training goes on";
    spdlog::error("{}; {} (checkpoint.on_save_error \"continue\"), latest is {}", e.what(), after,
                  latest ? *latest : std::string("(none)"));
  }
  return true;
}

bool CheckpointPolicy::ended_unsaved(std::int64_t step) const {
  return config_.checkpoint.saves() && saves_failed_ > 0 && last_committed_step_ != step;
}

bool CheckpointPolicy::wait() {
  // The pending save (if any) reports here: it committed on every rank or failed on every rank.
  const std::optional<std::int64_t> pending = std::exchange(pending_step_, std::nullopt);
  try {
    checkpointer_.wait();
    if (pending) last_committed_step_ = *pending;
    return true;
  } catch (const Error& e) {
    if (!tolerate_save_error(e)) throw;
    return false;
  }
}

bool CheckpointPolicy::save(std::int64_t step, bool wait_for_it) {
  wait();  // an earlier async save's error is reported (or thrown) on its own
  bool ok = true;
  saving_step_ = step;
  try {
    // A save waited for (a preemption's) is written synchronously: no snapshot copy first.
    save_checkpoint(step, /*synchronous=*/wait_for_it);
    pending_step_ = step;  // committed once wait() finds it finished without an error
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
  wait();  // an earlier async save's error is its own (training had gone on after it)
  stopping_ = true;
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
