// The glue between a ZeroEngine and checkpoint files: taking a host snapshot of this rank's
// state, describing the engine for the index, and loading a checkpoint (at any world size or
// stage) into the engine.
#pragma once

#include <functional>
#include <string>

#include "runtime/checkpoint/checkpointer.h"
#include "runtime/checkpoint/layout.h"
#include "runtime/checkpoint/rank_file.h"
#include "runtime/engine/zero_engine.h"

namespace zrt::checkpoint {

// Copies this rank's slices of every unit, in unit order, into host arrays of
// plan().total_shard() floats each, one per ZeroEngine state array (master, then the
// optimizer's states; synchronises the engine's streams): a Checkpointer's SnapshotFiller. At
// stage 0 every rank holds the same full state and only rank 0's is written.
void snapshot_engine(ZeroEngine& engine, const std::vector<float*>& arrays);

// The async form (a Checkpointer's SnapshotIssuer): issues the same copy with
// ZeroEngine::copy_state_out_async and returns at once; the returned function waits for it
// (from any thread). The engine keeps its state unchanged until the copy is done. delay_ms >= 0
// (a test hook) holds the copy back that long on its stream.
std::function<void()> snapshot_engine_async(ZeroEngine& engine, const std::vector<float*>& arrays,
                                            int delay_ms = -1);

// The engine's state in place (a Checkpointer's StateView) where the host can read it (the CPU
// backend, optimizer offload): per state array, one run per unit, in unit order, as
// snapshot_engine would copy them. Empty for a GPU's memory.
std::vector<std::vector<HostBytes>> engine_state_view(ZeroEngine& engine);

// The snapshot buffer's allocator for `engine` on `device`: pinned host memory when the state
// lives in a CUDA device's memory (the device-to-host copy is then a DMA at full bus speed),
// pageable host memory otherwise (the CPU backend, or optimizer offload, whose state already is
// in host memory and is copied with memcpy). Tracked by the device as MemCategory::kOther.
HostAllocator snapshot_allocator(Device& device, const ZeroEngine& engine);

// The index fields the engine knows: stage, dtypes, the optimizer's state names, counters, and
// this rank's share (index.share: the ranges of its state its file holds). One group: the
// tables and world too (every rank knows them). Several groups: the slices this rank writes
// (each unit by the first of its replicas, group 0's first in the file), whose rows the
// checkpointer gathers into rank 0's tables at save time (rank_share.h).
void describe_engine(const ZeroEngine& engine, CheckpointIndex& index);

// Reads <dir>/index.h5, finds the engine's parameters in it by name (checking shapes) and loads
// this rank's slice of every unit, resharding from whatever world sizes, stage and groups saved
// it. Collective (the engine gathers the new parameters). Returns the index (step, data
// position, ...). A parameter the checkpoint lacks, a checkpoint of another optimizer's state
// (Lion's into Adam, ...), or a checkpoint parameter that no rank of the run holds, is
// InvalidArgument naming it. `ranks` are the engine's ranks: with several groups (a rank holding
// part of the model) the last check is an all-reduce over them, which gives up after
// `timeout_s` (comm.timeout_s) with a Timeout when a rank died or hangs.
CheckpointIndex load_engine(const std::string& dir, ZeroEngine& engine,
                            MPI_Comm ranks = MPI_COMM_WORLD, double timeout_s = 600.0);

}  // namespace zrt::checkpoint
