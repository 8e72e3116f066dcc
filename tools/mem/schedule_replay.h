// Replays the engine's static per-micro-batch schedule (model_interface.h's call order) against
// a PartitionPlan, without memory or data, to find the peaks of the transient model-state
// buffers: stage-3 gathered parameters and stage-2/3 gradient buckets.
//
// The engine's sequence of gathers, releases and bucket allocations is a pure function of the
// plan and the options (DESIGN.md: a static schedule per micro-batch), so this replay follows the
// same rules as ZeroEngine::acquire / release / prefetch_after / open_grad_bucket and gives the
// byte counts its MemoryTracker records. test_zrt_mem_crosscheck compares the two in real runs;
// a change to those engine rules must be mirrored here (the test fails otherwise).
//
// Thread-safety: a plain function.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/engine/partition.h"
#include "runtime/engine/zero_engine.h"

namespace zrt::mem {

struct ReplayPeaks {
  std::int64_t gathered_elements = 0;  // peak of gathered (non-persistent) units, elements
  std::int64_t bucket_elements = 0;    // peak of live gradient buckets, elements
  std::int64_t sum_bytes = 0;          // peak of gathered x compute + buckets x compute, bytes
};

// `recomputed[m]`: module m runs again under activation checkpointing (acquire(m, kRecompute)
// before its backward). Replays gradient_accumulation_steps training micro-batches, then one
// eval pass (forward only).
ReplayPeaks replay_schedule(const PartitionPlan& plan, const EngineOptions& options,
                            int num_modules, const std::vector<bool>& recomputed);

}  // namespace zrt::mem
