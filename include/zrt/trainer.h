// The training loop of zrt-train as a library: zrt::Trainer runs a validated config (DeepSpeed
// schema; config/config.h) on a caller's model (zrt::ModelFactory) or on the model
// registry's. train/trainer.h documents it; docs/extending.md, "Use zrt as a library",
// walks through examples/custom_model.
#pragma once

#include "config/config.h"
#include "runtime/comm/mpi_runtime.h"
#include "runtime/common/error.h"
#include "runtime/common/log.h"
#include "train/trainer.h"
#include "zrt/model.h"

namespace zrt {

using train::ModelFactory;
using train::RankInfo;
using train::RunSummary;
using train::Trainer;
using train::TrainHooks;

}  // namespace zrt
