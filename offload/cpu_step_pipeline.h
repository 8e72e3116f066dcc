// The CPU optimizer's step of one training step: every offloaded unit's slices, in the order the
// next forward needs the units, as one stream of chunks that one team of threads takes in turn.
//
// Why one stream and not a parallel step per unit: a per-unit step ends with a barrier, and the
// unit's last chunk decides when its update may go up. On a GPU host the threads that launch
// kernels and run the copy stream's callbacks take a core from the team now and then, and the
// thread that lost its core holds the whole team at that barrier (an H100 host stepped GPT-2's
// 7M-parameter blocks ~10% slower than its 39M-parameter embedding, and the unit stepped while
// the next forward started at twice its neighbours' time; BENCHMARKS.md, "GPU session"). Here a
// late chunk delays only its own unit's completion: the other threads go on with the next
// unit's chunks, so the chain of units runs at the memory bandwidth the team has.
//
// Order and waits: chunks are taken in unit order, within a unit in element order (the unit's
// padding last, one chunk for all of it). Before a thread writes a unit it waits (once per
// thread and unit) for `slot_free`, the buffer the unit writes into being free: a staging buffer
// having carried its previous unit up, or a host parameter slice read by everything enqueued
// before the step; before it reads a slice it waits for that slice's gradient piece to be on the
// host (`landed`). Every element's update depends only on its own inputs, so the cut gives the
// bits one call of HostOptimizer::step gives.
#pragma once

#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "runtime/device/stream.h"
#include "runtime/engine/optimizer_interface.h"
#include "runtime/trace/trace_recorder.h"

namespace zrt {

// `bytes` bytes at `at` in the buffer a unit writes its parameters into.
struct CpuStepZeroRange {
  std::byte* at = nullptr;
  std::size_t bytes = 0;
};

// One unit's work in a CPU step.
struct CpuStepUnit {
  std::vector<OptimizerSlice> slices;  // the unit's owned elements, cut where its pieces land
  // The bytes of the unit's staging buffer that hold no owned element (the partition's padding),
  // written with zeros after `slot_free` and before `released`: the buffer still holds its
  // previous unit's bytes there (or whatever the allocation held), and the whole slice goes up,
  // where the padding must be zero (partition.h) because qwZ's block scales read it.
  std::vector<CpuStepZeroRange> padding;
  // Per slice: which of the pipeline's prepared steps steps it (empty: the first for every
  // slice). Several when parameters count different Adam steps (ZeroEngine's steps not taken).
  std::vector<std::size_t> step_of;
  std::vector<Event*> landed;  // per slice: its gradient is on the host (null: already)
  Event* slot_free = nullptr;  // waited for before the unit is written (null: no wait)
  // Run by the thread that finishes the unit's last chunk, before `done` is set.
  std::function<void()> after;
  std::shared_ptr<std::promise<void>> done;  // set once the unit is stepped, or to the error
  // Run once `done` is set, whether to a value or to the error, exactly once: what lets the
  // unit's copy up go (a HostSignal raise). Must not throw.
  std::function<void()> released;
  std::string trace_name;  // its span on the CPU-optimizer track
};

// Steps every unit with `step` on up to `threads` threads (the calling thread among them), each
// unit's `done` set as soon as its last chunk is done. On an error (a failed wait, a throwing
// `after`) the threads stop taking chunks, every unit not yet done gets the error in `done`,
// and the first error is rethrown; every unit's `released` runs either way. With `trace`, each
// unit's span runs from its first chunk's start (after its waits) to its last chunk's end.
void run_cpu_step_pipeline(std::vector<CpuStepUnit>& units, const HostOptimizer::RangeStep& step,
                           int threads, TraceRecorder* trace);
// The same with a prepared step per CpuStepUnit::step_of index.
void run_cpu_step_pipeline(std::vector<CpuStepUnit>& units,
                           const std::vector<HostOptimizer::RangeStep>& steps, int threads,
                           TraceRecorder* trace);

// The chunks a slice of `numel` elements whose fp32 parameters start at `param` is cut into:
// [begin, end) ranges of at most `chunk` elements, the boundaries after the first on addresses
// aligned to `align_bytes` (full cache lines and vector stores for every chunk but the first).
struct CpuStepRange {
  std::int64_t begin = 0;
  std::int64_t end = 0;
};
std::vector<CpuStepRange> cpu_step_chunks(const float* param, std::int64_t numel,
                                          std::int64_t chunk, std::int64_t align_bytes);

}  // namespace zrt
