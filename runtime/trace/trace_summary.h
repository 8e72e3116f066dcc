// What each traced step's streams did, in numbers: each track's busy time (the union of its spans
// within the step), and so the compute stream's idle time, the figure that says whether the
// device waited for communication, copies or the CPU optimizer. On a GPU the compute track's
// spans are the modules' kernels timed by CUDA events, so its idle time is the GPU's.
//
// Pure functions over TraceRecorder::events(); zrt-train logs them when it writes a trace.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/trace/trace_recorder.h"

namespace zrt {

struct TraceStepSummary {
  std::string name;  // the step marker's name: "step N"
  double start_us = 0.0;
  double duration_us = 0.0;
  // Per TraceTrack (kSteps excluded: 0): the union of the track's spans clipped to the step.
  std::array<double, kNumTraceTracks> busy_us{};
  // The CPU optimizer's busy time during which the compute track was busy too.
  double cpu_optimizer_under_compute_us = 0.0;

  double busy(TraceTrack track) const { return busy_us[static_cast<std::size_t>(track)]; }
  double compute_idle_us() const { return duration_us - busy(TraceTrack::kCompute); }
};

// One summary per step marker, in the markers' order. Spans crossing a step's boundary count
// for the part inside it; spans of one track that overlap are counted once.
std::vector<TraceStepSummary> summarize_trace_steps(const std::vector<TraceEvent>& events);

// One line: "step 2: 37.7 ms; compute busy 30.1 ms, idle 7.6 ms (20%); comm 3.0 ms; copy
// 5.2 ms; CPU optimizer 12.0 ms (8.0 ms under compute)". Tracks with no spans are left out.
std::string format_trace_step(const TraceStepSummary& step);

}  // namespace zrt
