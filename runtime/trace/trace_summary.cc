#include "runtime/trace/trace_summary.h"

#include <algorithm>
#include <utility>

#include <spdlog/fmt/fmt.h>

namespace zrt {

namespace {

using Interval = std::pair<double, double>;  // [begin, end) in microseconds

// The union of `spans` clipped to [from, to), as sorted disjoint intervals.
std::vector<Interval> merged_within(std::vector<Interval> spans, double from, double to) {
  std::vector<Interval> out;
  std::sort(spans.begin(), spans.end());
  for (const Interval& s : spans) {
    const double begin = std::max(s.first, from);
    const double end = std::min(s.second, to);
    if (end <= begin) continue;
    if (!out.empty() && begin <= out.back().second) {
      out.back().second = std::max(out.back().second, end);
    } else {
      out.emplace_back(begin, end);
    }
  }
  return out;
}

double total(const std::vector<Interval>& intervals) {
  double sum = 0.0;
  for (const Interval& i : intervals) sum += i.second - i.first;
  return sum;
}

// The length of the intersection of two sorted disjoint interval lists.
double overlap(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  double sum = 0.0;
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const double begin = std::max(a[i].first, b[j].first);
    const double end = std::min(a[i].second, b[j].second);
    if (end > begin) sum += end - begin;
    if (a[i].second < b[j].second) {
      ++i;
    } else {
      ++j;
    }
  }
  return sum;
}

}  // namespace

std::vector<TraceStepSummary> summarize_trace_steps(const std::vector<TraceEvent>& events) {
  std::array<std::vector<Interval>, kNumTraceTracks> spans;
  for (const TraceEvent& e : events) {
    spans[static_cast<std::size_t>(e.track)].emplace_back(e.start_us, e.start_us + e.duration_us);
  }
  std::vector<TraceStepSummary> out;
  for (const TraceEvent& marker : events) {
    if (marker.track != TraceTrack::kSteps) continue;
    TraceStepSummary s;
    s.name = marker.name;
    s.start_us = marker.start_us;
    s.duration_us = marker.duration_us;
    const double to = marker.start_us + marker.duration_us;
    std::array<std::vector<Interval>, kNumTraceTracks> merged;
    for (int t = 1; t < kNumTraceTracks; ++t) {
      merged[static_cast<std::size_t>(t)] =
          merged_within(spans[static_cast<std::size_t>(t)], marker.start_us, to);
      s.busy_us[static_cast<std::size_t>(t)] = total(merged[static_cast<std::size_t>(t)]);
    }
    s.cpu_optimizer_under_compute_us =
        overlap(merged[static_cast<std::size_t>(TraceTrack::kCpuOptimizer)],
                merged[static_cast<std::size_t>(TraceTrack::kCompute)]);
    out.push_back(std::move(s));
  }
  return out;
}

std::string format_trace_step(const TraceStepSummary& s) {
  const double ms = 1e-3;
  const double idle = s.compute_idle_us();
  std::string line =
      fmt::format("{}: {:.1f} ms; compute busy {:.1f} ms, idle {:.1f} ms ({:.0f}%)", s.name,
                  s.duration_us * ms, s.busy(TraceTrack::kCompute) * ms, idle * ms,
                  s.duration_us > 0.0 ? 100.0 * idle / s.duration_us : 0.0);
  for (TraceTrack t : {TraceTrack::kComm, TraceTrack::kCopy}) {
    if (s.busy(t) > 0.0) line += fmt::format("; {} {:.1f} ms", trace_track_name(t), s.busy(t) * ms);
  }
  if (s.busy(TraceTrack::kCpuOptimizer) > 0.0) {
    line += fmt::format(
        "; {} {:.1f} ms ({:.1f} ms under compute)", trace_track_name(TraceTrack::kCpuOptimizer),
        s.busy(TraceTrack::kCpuOptimizer) * ms, s.cpu_optimizer_under_compute_us * ms);
  }
  return line;
}

}  // namespace zrt
