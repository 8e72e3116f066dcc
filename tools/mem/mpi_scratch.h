// The CPU backend's collective scratch, as zrt-mem counts it: what the MpiProcessGroups of a
// run (the engine's shard groups, expert parallelism's two groups, zrt-train's control group)
// leave allocated in the comm category after a step, from the units' sizes alone.
//
// Thread-safety: plain functions of their arguments.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/comm/process_group.h"
#include "runtime/engine/engine_options.h"

namespace zrt::mem {

// A unit as the collectives see it: its padded elements, the slice a rank owns, its shard
// group (0 dense, 1 expert parallelism's experts).
struct UnitSize {
  std::int64_t numel = 0;
  std::int64_t shard = 0;
  int group = 0;
  bool frozen = false;  // never reduced (Unit::frozen)
};

// Bytes of MPI scratch (MpiProcessGroup's two slots per group, each grown to its largest
// request) the engine's reductions and gradient norm and, with `trainer`, zrt-train's control
// group leave allocated, for `units` at `world` ranks (`o`: stage, dtypes, qgZ, autoep_size).
// `sequence_sum_floats`: the largest fp32 all-reduce the model issues over the sequence-parallel
// group (o.sequence_parallel_size ranks; ModelDef::sequence_group_sum_floats), 0 for none.
std::int64_t mpi_scratch_bytes(const std::vector<UnitSize>& units, const EngineOptions& o,
                               int world, const CommOptions& comm, bool trainer,
                               std::int64_t sequence_sum_floats = 0);

}  // namespace zrt::mem
