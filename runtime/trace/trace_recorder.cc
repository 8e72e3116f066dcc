#include "runtime/trace/trace_recorder.h"

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "runtime/common/error.h"

namespace zrt {

namespace {

// Recorder ids only tell recorders apart (a later one may reuse a freed one's address).
std::uint64_t next_recorder_id() {
  static std::atomic<std::uint64_t> next{1};
  return next.fetch_add(1);
}

// Each thread remembers its buffer in the recorder it last recorded into.
struct CachedBuffer {
  std::uint64_t recorder_id = 0;
  void* buffer = nullptr;
};
thread_local CachedBuffer t_cached;

}  // namespace

const char* trace_track_name(TraceTrack track) {
  switch (track) {
    case TraceTrack::kSteps:
      return "steps";
    case TraceTrack::kCompute:
      return "compute";
    case TraceTrack::kComm:
      return "comm";
    case TraceTrack::kCopy:
      return "copy";
    case TraceTrack::kCpuOptimizer:
      return "CPU optimizer";
  }
  return "?";
}

TraceRecorder::TraceRecorder(int rank, Clock::time_point origin)
    : rank_(rank), id_(next_recorder_id()), origin_(origin) {}

TraceRecorder::~TraceRecorder() = default;

double TraceRecorder::to_us(Clock::time_point t) const {
  return std::chrono::duration<double, std::micro>(t - origin_).count();
}

double TraceRecorder::now_us() const {
  return to_us(Clock::now());
}

TraceRecorder::ThreadBuffer& TraceRecorder::buffer_of_this_thread() {
  if (t_cached.recorder_id == id_) return *static_cast<ThreadBuffer*>(t_cached.buffer);
  std::lock_guard<std::mutex> lock(buffers_mutex_);
  buffers_.push_back(std::make_unique<ThreadBuffer>());
  t_cached = CachedBuffer{id_, buffers_.back().get()};
  return *buffers_.back();
}

void TraceRecorder::add(TraceTrack track, std::string name, double start_us, double duration_us) {
  append(TraceEvent{track, std::move(name), start_us, duration_us, {}});
}

void TraceRecorder::append(TraceEvent event) {
  event.duration_us = std::max(event.duration_us, 0.0);
  ThreadBuffer& buffer = buffer_of_this_thread();
  std::lock_guard<std::mutex> lock(buffer.mutex);
  buffer.events.push_back(std::move(event));
}

void TraceRecorder::add_deferred(std::function<TraceEvent()> resolve) {
  ThreadBuffer& buffer = buffer_of_this_thread();
  std::lock_guard<std::mutex> lock(buffer.mutex);
  buffer.deferred.push_back(std::move(resolve));
}

void TraceRecorder::add_step(std::int64_t step, double start_us, double end_us,
                             std::map<std::string, std::int64_t> args) {
  append(TraceEvent{TraceTrack::kSteps, "step " + std::to_string(step), start_us, end_us - start_us,
                    std::move(args)});
}

std::vector<TraceEvent> TraceRecorder::events() {
  std::vector<TraceEvent> out;
  std::lock_guard<std::mutex> list_lock(buffers_mutex_);
  for (auto& buffer : buffers_) {
    std::lock_guard<std::mutex> lock(buffer->mutex);
    for (auto& resolve : buffer->deferred) {
      TraceEvent e = resolve();
      e.duration_us = std::max(e.duration_us, 0.0);
      buffer->events.push_back(std::move(e));
    }
    buffer->deferred.clear();
    out.insert(out.end(), buffer->events.begin(), buffer->events.end());
  }
  std::stable_sort(out.begin(), out.end(), [](const TraceEvent& a, const TraceEvent& b) {
    return a.start_us < b.start_us;
  });
  return out;
}

void TraceRecorder::write(const std::string& path) {
  using nlohmann::json;
  json trace_events = json::array();
  trace_events.push_back({{"name", "process_name"},
                          {"ph", "M"},
                          {"pid", rank_},
                          {"args", {{"name", "rank " + std::to_string(rank_)}}}});
  for (int t = 0; t < kNumTraceTracks; ++t) {
    const char* name = trace_track_name(static_cast<TraceTrack>(t));
    trace_events.push_back({{"name", "thread_name"},
                            {"ph", "M"},
                            {"pid", rank_},
                            {"tid", t},
                            {"args", {{"name", name}}}});
    trace_events.push_back({{"name", "thread_sort_index"},
                            {"ph", "M"},
                            {"pid", rank_},
                            {"tid", t},
                            {"args", {{"sort_index", t}}}});
  }
  for (const TraceEvent& e : events()) {
    json event = {{"name", e.name},
                  {"cat", trace_track_name(e.track)},
                  {"ph", "X"},
                  {"ts", e.start_us},
                  {"dur", e.duration_us},
                  {"pid", rank_},
                  {"tid", static_cast<int>(e.track)}};
    if (!e.args.empty()) event["args"] = e.args;  // shown when the event is selected
    trace_events.push_back(std::move(event));
  }
  const json document = {{"traceEvents", std::move(trace_events)}, {"displayTimeUnit", "ms"}};
  const std::filesystem::path file(path);
  if (file.has_parent_path()) {
    std::error_code ec;
    std::filesystem::create_directories(file.parent_path(), ec);
  }
  std::ofstream out(path);
  if (!out) ZRT_THROW(Error, "trace: cannot open '{}' for writing", path);
  out << document.dump() << "\n";
  out.close();
  if (!out) ZRT_THROW(Error, "trace: writing '{}' failed", path);
}

std::string trace_path_for_rank(const std::string& path, int rank, int world) {
  if (world <= 1) return path;
  const std::filesystem::path p(path);
  std::filesystem::path out = p.parent_path() / p.stem();
  out += ".rank" + std::to_string(rank) + p.extension().string();
  return out.string();
}

}  // namespace zrt
