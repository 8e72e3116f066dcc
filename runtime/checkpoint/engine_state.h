// The glue between a ZeroEngine and checkpoint files: taking a host snapshot of this rank's
// state, describing the engine for the index, and loading a checkpoint (at any world size or
// stage) into the engine.
#pragma once

#include <string>

#include "runtime/checkpoint/layout.h"
#include "runtime/checkpoint/rank_file.h"
#include "runtime/engine/zero_engine.h"

namespace zrt::checkpoint {

// Host copies of this rank's slices of every unit (synchronises the engine's streams). At stage
// 0 every rank holds the same full state and only rank 0's copy is written.
RankSnapshot snapshot_engine(ZeroEngine& engine);

// The index fields the engine knows: tables, world, stage, dtypes, counters.
void describe_engine(const ZeroEngine& engine, CheckpointIndex& index);

// Reads <dir>/index.h5, checks it against the engine's parameters (names and shapes) and loads
// this rank's slices, resharding from the saved world size and stage. Collective (the engine
// gathers the new parameters). Returns the index (step, data position, ...).
CheckpointIndex load_engine(const std::string& dir, ZeroEngine& engine);

}  // namespace zrt::checkpoint
