// Stream and Event: in-order work queues and the markers that order work across them, with
// CUDA's semantics on every backend.
//
// - Work enqueued on one stream runs in order; streams run concurrently with each other.
// - Event::record(s) marks the point in s after everything enqueued so far.
// - Stream::wait(e) makes later work on the stream wait for e's most recent record *at the
//   time of the wait call*; re-recording e afterwards does not change what was waited for.
//   Waiting on a never-recorded event is a no-op.
// - A host callback runs on the host in stream order and must not call the stream API
//   (it throws if it does, on the CPU backend).
// - An error in stream work (a timed-out collective, say) is sticky: later work on that stream
//   is skipped, and synchronize() or a wait on an event recorded after it rethrows it.
//
// - Timeline trace: the work enqueued between trace_begin(recorder, track, label) and
//   trace_end() becomes one event `label` on `track` of the recorder (runtime/trace), timed
//   where the work runs: from the start of the first work item to the end of the last (waits
//   before the first item are not counted). Spans do not nest: a trace_begin ends the open
//   span. Nothing is recorded when no span is open, so a stream costs nothing untraced.
//
// Streams and events are not thread-safe objects: one thread enqueues on a given stream.
#pragma once

#include <functional>
#include <memory>
#include <string>

namespace zrt {

class Event;
class TraceRecorder;
enum class TraceTrack;

class Stream {
 public:
  virtual ~Stream() = default;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  virtual const std::string& name() const = 0;
  // Later work on this stream waits for `event`'s most recent record (see above).
  virtual void wait(const Event& event) = 0;
  // Blocks the calling thread until all work enqueued so far has finished; rethrows a stream
  // error.
  virtual void synchronize() = 0;
  // Runs fn on the host after all work enqueued so far; later work waits for it.
  virtual void host_callback(std::function<void()> fn) = 0;
  // Timeline trace spans (see above). `recorder` must outlive the span's work.
  virtual void trace_begin(TraceRecorder& recorder, TraceTrack track, std::string label) = 0;
  virtual void trace_end() = 0;

 protected:
  Stream() = default;
};

class Event {
 public:
  virtual ~Event() = default;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  // Captures the work enqueued on `stream` so far.
  virtual void record(Stream& stream) = 0;
  // Blocks until the most recent record has completed (returns at once if never recorded);
  // rethrows the recording stream's error.
  virtual void synchronize() = 0;
  // Returns true iff the most recent record has completed (or the event was never recorded).
  virtual bool query() const = 0;

 protected:
  Event() = default;
};

}  // namespace zrt
