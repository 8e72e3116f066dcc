// TraceRecorder: a timeline of what each stream did during a few training steps, written as a
// Chrome trace-event file (the "traceEvents" JSON array format) that opens in chrome://tracing
// and Perfetto. Each rank is one process (pid = rank); each track is one thread row: the step
// markers, then one row per stream kind (compute, comm, copy, CPU optimizer).
//
// Events come from where the work runs: the CPU backend's stream workers time the work between
// Stream::trace_begin and trace_end; the CUDA backend records event pairs, whose times can be
// read only once the GPU is done, so it hands the recorder a deferred event that write()
// resolves. Times are microseconds since `origin` (a steady-clock point; ranks of one node that
// share it line up).
//
// Recording costs nothing when off: the engine and the streams hold a TraceRecorder pointer and
// check it for null; the recorder exists only while a trace is wanted.
//
// Thread-safety: add() and add_deferred() may be called from any thread (each thread appends to
// its own buffer). events() and write() must run after the traced work has finished (the
// streams synchronized) and not concurrently with add(). The recorder must outlive every stream
// span that records into it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace zrt {

// The rows of a trace, in display order. Each stream kind is serial, so events on one track
// never overlap.
enum class TraceTrack { kSteps, kCompute, kComm, kCopy, kCpuOptimizer };
constexpr int kNumTraceTracks = 5;
// "steps", "compute", "comm", "copy", "CPU optimizer".
const char* trace_track_name(TraceTrack track);

struct TraceEvent {
  TraceTrack track = TraceTrack::kCompute;
  std::string name;
  double start_us = 0.0;     // since the recorder's origin
  double duration_us = 0.0;  // >= 0
  // Counters of the event (the file's "args"): a step's bytes sent, within and across nodes.
  std::map<std::string, std::int64_t> args;
};

class TraceRecorder {
 public:
  using Clock = std::chrono::steady_clock;

  // Records for `rank` (the pid in the file); times are relative to `origin`.
  explicit TraceRecorder(int rank, Clock::time_point origin = Clock::now());
  ~TraceRecorder();
  TraceRecorder(const TraceRecorder&) = delete;
  TraceRecorder& operator=(const TraceRecorder&) = delete;

  int rank() const { return rank_; }
  // Unique among the recorders of this process (a stream caches per-recorder state by it).
  std::uint64_t id() const { return id_; }
  // Microseconds from the origin to now.
  double now_us() const;
  double to_us(Clock::time_point t) const;

  // Appends one complete event. Thread-safe; a negative duration is clamped to 0.
  void add(TraceTrack track, std::string name, double start_us, double duration_us);
  // Appends an event whose times are known only later (GPU events); write() and events() call
  // `resolve` once. Thread-safe.
  void add_deferred(std::function<TraceEvent()> resolve);
  // A step marker on the steps track: "step N" from start_us to end_us, with its counters.
  void add_step(std::int64_t step, double start_us, double end_us,
                std::map<std::string, std::int64_t> args = {});

  // Every event recorded so far (deferred ones resolved), sorted by start time.
  std::vector<TraceEvent> events();
  // Writes the Chrome trace-event file (metadata naming the process and tracks, then "X"
  // events with ts/dur in microseconds). Throws zrt::Error naming the path if it cannot.
  void write(const std::string& path);

 private:
  void append(TraceEvent event);  // thread-safe; a negative duration is clamped to 0
  struct ThreadBuffer {
    std::mutex mutex;  // uncontended: taken by its own thread and by events()
    std::vector<TraceEvent> events;
    std::vector<std::function<TraceEvent()>> deferred;
  };
  ThreadBuffer& buffer_of_this_thread();

  const int rank_;
  const std::uint64_t id_;
  const Clock::time_point origin_;
  std::mutex buffers_mutex_;  // guards the list, not the buffers' contents
  std::vector<std::unique_ptr<ThreadBuffer>> buffers_;
};

// The file each rank writes for a configured path: the path itself on one rank; with several,
// the rank before the extension ("trace.json" -> "trace.rank1.json").
std::string trace_path_for_rank(const std::string& path, int rank, int world);

}  // namespace zrt
