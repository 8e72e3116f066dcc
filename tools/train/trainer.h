// Trainer: the training loop of zrt-train. One object per rank: builds the device, streams,
// process groups, the GPT model, the ZeRO engine and the data streams from a validated Config,
// then trains, logs (one line per logged step, metrics.jsonl on rank 0), evaluates and samples.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/mpi_runtime.h"
#include "runtime/config/config.h"

namespace zrt::train {

// What a run produced (rank-identical values), for tests and the caller.
struct RunSummary {
  std::vector<double> losses;       // mean training loss of every step
  std::vector<double> eval_losses;  // every evaluation
  std::int64_t steps = 0;
  std::int64_t skipped = 0;
  std::string sample;  // the generated text (empty if sample_tokens is 0)
};

// Runs the whole training described by `config` on every rank of `mpi`. Collective.
RunSummary run_training(const Config& config, const MpiRuntime& mpi);

}  // namespace zrt::train
