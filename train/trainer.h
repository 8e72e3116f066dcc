// The training loop's public face: run_training() and zrt::Trainer run a validated Config on
// every rank, with the model registry's model for the config's model block or the caller's own
// (ModelFactory); RunSummary says how the run ended. One run builds the device, streams,
// process groups, the model, the ZeRO engine and the data streams, then trains, logs (one line
// per logged step, metrics.jsonl and DeepSpeed's monitors on rank 0), evaluates and samples
// (TrainingRun, train/training_run.h). checkpoint.load is decided first
// (runtime/checkpoint/load_plan.h), so a run that would overwrite another run's checkpoints
// stops before anything is built.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "models/model_registry.h"
#include "runtime/comm/mpi_runtime.h"
#include "runtime/model_interface.h"

namespace zrt {
class ZeroEngine;
struct StepResult;
}  // namespace zrt

namespace zrt::train {

// How a run ended (rank-identical).
enum class RunStatus {
  kCompleted,  // train.steps reached (or nothing left to train)
  // Stopped early because TrainHooks::stop_requested said so on some rank (a preemption
  // signal): a checkpoint of the step reached was saved and committed.
  kPreempted,
  // Stopped early on request, but the checkpoint of the step reached could not be saved
  // (checkpoint.on_save_error "continue"): `latest` names an earlier checkpoint, if any.
  kPreemptedUnsaved,
  // train.steps reached, but the last step's checkpoint could not be saved
  // (checkpoint.on_save_error "continue"): the trained state is in no checkpoint; zrt-train
  // exits 1.
  kCompletedUnsaved,
};

// What a run produced (rank-identical values), for tests and the caller.
struct RunSummary {
  RunStatus status = RunStatus::kCompleted;
  std::vector<double> losses;       // mean training loss of every step
  std::vector<double> eval_losses;  // every evaluation
  std::int64_t steps = 0;
  std::int64_t resumed_from = 0;  // the checkpoint's step (0: a fresh start)
  std::int64_t skipped = 0;
  std::int64_t saves_failed = 0;  // saves that failed under checkpoint.on_save_error "continue"
  std::string sample;             // the generated text (empty if sample_tokens is 0)
};

// Where this process sits among the ranks of MPI_COMM_WORLD.
struct RankInfo {
  int rank = 0;
  int world = 1;
  int local_rank = 0;  // on this node: selects the GPU
  int local_size = 1;
};

// Optional callbacks into a run (the tool, tests).
struct TrainHooks {
  // The watchdog's report of a hang (an operation past comm_timeout_s; the message names it,
  // the step and the ranks missing), on the thread that saw it. zrt-train ends the job here;
  // unset, the run fails with zrt::Timeout as usual.
  std::function<void(const std::string& message)> on_hang;
  // After each step's update is enqueued, on every rank (collective calls on the engine are
  // allowed). `result` may be undecided (result.decided false: the loop reads a quiet step's
  // decision at the next step); engine.settle_step() gives the decided one, at the cost of a
  // host wait.
  std::function<void(std::int64_t step, ZeroEngine& engine, const StepResult& result)> after_step;
  // Polled once per step on every rank, just before the step's loss all-reduce: true on any
  // rank stops the run on every rank at that step boundary (the answer rides on the all-reduce,
  // no extra collective), after a synchronous checkpoint of the step reached. zrt-train answers
  // from its signal handlers' flag (SIGTERM, SIGINT, SIGUSR1). Must be cheap and thread-safe.
  std::function<bool()> stop_requested;
  // Called on every rank when the run has agreed to stop (before the save), for the caller to
  // start its own clock (zrt-train: checkpoint.preempt_grace_s).
  std::function<void(std::int64_t step)> on_stop;
};

// A model the caller brings, for a run that does not go through the model registry: how to
// build it on the run's kernel context, and what the loop needs to know about it. The config's
// model block is then not resolved (it must still validate); its activation_checkpointing is
// passed to `build` through ModelOptions.
struct ModelFactory {
  // Builds the model on `ctx` (the run's device and compute stream; the model enqueues all its
  // work there). Called once per rank, after the device and process groups exist.
  std::function<std::unique_ptr<Model>(kernels::KernelContext& ctx, const ModelOptions& options)>
      build;
  int seq_len = 0;     // the loop trains (and samples) at this sequence length
  int vocab_size = 0;  // every token id of the data must be below it
  // One line for the log, e.g. "byte MLP (C128 H512 V256, 0.2M params)".
  std::string description = "a caller's model";
  // Training FLOPs per token at a sequence length, for the MFU column; unset: MFU reads 0.
  std::function<double(int seq_len)> flops_per_token;
  // Initial values given the built model, the run's seed and model.init_from. Unset: the
  // model's own Model::init_parameter, and a non-empty model.init_from is an error.
  std::function<ParamInitializer(const Model& model, std::uint64_t seed,
                                 const std::string& init_from)>
      initializer;
};

// The registry's model for a model block (model.type picks the entry), as a ModelFactory.
// Resolves the block now: InvalidArgument for an unknown type or an invalid block.
ModelFactory registry_model(const ModelConfig& model);

// Runs the whole training described by `config` on every rank. Collective over MPI_COMM_WORLD.
// Without a ModelFactory the model is the registry's for config.model (zrt-train).
RunSummary run_training(const Config& config, const RankInfo& ranks, const TrainHooks& hooks = {});
RunSummary run_training(const Config& config, const RankInfo& ranks, const ModelFactory& model,
                        const TrainHooks& hooks = {});
inline RankInfo rank_info(const MpiRuntime& mpi) {
  return RankInfo{mpi.rank(), mpi.size(), mpi.local_rank(), mpi.local_size()};
}
inline RunSummary run_training(const Config& config, const MpiRuntime& mpi,
                               const TrainHooks& hooks = {}) {
  return run_training(config, rank_info(mpi), hooks);
}

// The training loop as a library call: zrt-train's run (checkpoints, evaluation, metrics.jsonl,
// monitors, trace) on a caller's model or the config's. One per rank, on every rank:
//
//   zrt::MpiRuntime mpi(&argc, &argv);
//   zrt::init_logging(mpi.rank());
//   zrt::Trainer trainer(zrt::load_config("run.json", mpi.size()), mpi);
//   zrt::RunSummary summary = trainer.run(my_model_factory);
class Trainer {
 public:
  // `config` is validated for mpi.size() ranks (load_config / parse_config).
  Trainer(Config config, const MpiRuntime& mpi)
      : config_(std::move(config)), ranks_(rank_info(mpi)) {}
  Trainer(Config config, const RankInfo& ranks) : config_(std::move(config)), ranks_(ranks) {}

  const Config& config() const { return config_; }
  const RankInfo& ranks() const { return ranks_; }

  // Trains `model`. Collective over MPI_COMM_WORLD; throws what the run throws.
  RunSummary run(const ModelFactory& model, const TrainHooks& hooks = {}) const {
    return run_training(config_, ranks_, model, hooks);
  }
  // Trains the config's model block through the registry, as zrt-train does.
  RunSummary run(const TrainHooks& hooks = {}) const {
    return run_training(config_, ranks_, hooks);
  }

 private:
  Config config_;
  RankInfo ranks_;
};

}  // namespace zrt::train
