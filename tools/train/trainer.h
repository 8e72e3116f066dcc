// Trainer: the training loop of zrt-train. One object per rank: builds the device, streams,
// process groups, the GPT model, the ZeRO engine and the data streams from a validated Config,
// then trains, logs (one line per logged step, metrics.jsonl and DeepSpeed's monitors on rank 0),
// evaluates and samples. checkpoint.load is decided first (runtime/checkpoint/load_plan.h), so
// a run that would overwrite another run's checkpoints stops before anything is built.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/mpi_runtime.h"
#include "runtime/config/config.h"

namespace zrt {
class ZeroEngine;
struct StepResult;
}  // namespace zrt

namespace zrt::train {

// What a run produced (rank-identical values), for tests and the caller.
struct RunSummary {
  std::vector<double> losses;       // mean training loss of every step
  std::vector<double> eval_losses;  // every evaluation
  std::int64_t steps = 0;
  std::int64_t resumed_from = 0;  // the checkpoint's step (0: a fresh start)
  std::int64_t skipped = 0;
  std::string sample;  // the generated text (empty if sample_tokens is 0)
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
  // After each step's update, on every rank (collective calls on the engine are allowed).
  std::function<void(std::int64_t step, ZeroEngine& engine, const StepResult& result)> after_step;
};

// Runs the whole training described by `config` on every rank. Collective over MPI_COMM_WORLD.
RunSummary run_training(const Config& config, const RankInfo& ranks, const TrainHooks& hooks = {});
inline RunSummary run_training(const Config& config, const MpiRuntime& mpi,
                               const TrainHooks& hooks = {}) {
  return run_training(config, RankInfo{mpi.rank(), mpi.size(), mpi.local_rank(), mpi.local_size()},
                      hooks);
}

}  // namespace zrt::train
