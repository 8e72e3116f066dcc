// The parallel degrees an engine configuration implies (parallel_dims.h): the zero_optimization
// settings of EngineOptions over `world` ranks in nodes of `ranks_per_node` (0: unknown). The
// trainer builds its ParallelLayout from them and zrt-mem sizes the shard world with them, so
// both read the same figures.
#pragma once

#include "runtime/comm/parallel_dims.h"
#include "runtime/engine/zero_engine.h"

namespace zrt {

ParallelDims parallel_dims(const EngineOptions& options, int world, int ranks_per_node);

}  // namespace zrt
