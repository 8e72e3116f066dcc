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
// - Stream::wait(signal, value) makes later work on the stream wait until the HostSignal's
//   counter reaches `value`, with no host thread on the stream's side (see HostSignal).
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

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace zrt {

class Event;
class HostSignal;
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
  // Later work on this stream waits until `signal`'s counter reaches `value` (a cyclic
  // greater-or-equal: (int32)(counter - value) >= 0). A host thread must raise it that far, or the
  // stream never goes on.
  virtual void wait(const HostSignal& signal, std::uint32_t value) = 0;
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

// A counter in host memory that host threads raise and streams wait for (Stream::wait), for
// stream work that must follow host work the host cannot enqueue behind: optimizer offload's
// copy of a unit's updated parameters up, once the CPU optimizer's threads have written them. On
// CUDA the wait is a stream memory operation (the GPU polls the word), so the copy starts
// microseconds after the raise; a host callback needs the driver's callback thread to get a
// core, and with the CPU optimizer's team on every core that took milliseconds per unit
// (BENCHMARKS.md, "GPU session"). The wait is invisible to the device's own dependency
// tracking: stream work ordered by it must not be something the raising thread waits for.
// Thread-safe: any thread may raise; one thread enqueues waits on a given stream.
class HostSignal {
 public:
  virtual ~HostSignal() = default;
  HostSignal(const HostSignal&) = delete;
  HostSignal& operator=(const HostSignal&) = delete;

  // Sets the counter to `value`: stream work waiting for it (or an earlier value) may run, and
  // sees every write the calling thread made to host memory before the raise. The destructor
  // raises the counter to the highest value waited for, so no stream waits on freed memory.
  virtual void raise(std::uint32_t value) noexcept = 0;
  // The counter now.
  virtual std::uint32_t value() const noexcept = 0;

 protected:
  HostSignal() = default;
};

// Runs every one of `drains` (a stream's or an owner's synchronize) in order, also after one
// throws, then rethrows the first error: a drain that stopped at a failed stream would leave the
// others running on buffers the caller frees next.
void drain_each(const std::vector<std::function<void()>>& drains);

// Drains `stream` when the scope it guards is left by an exception, so that function-scope
// buffers handed to work on the stream (a gather into scratch, a copy into a host vector) are not
// freed while that work may still run. Declare it after those buffers: it is destroyed first.
// An error of the drain itself is logged, not thrown: the exception in flight is the one to
// report. Bounded as the stream's work is: a collective a dead peer never joins ends at the
// group's timeout (the watchdog's on NCCL).
class DrainOnUnwind {
 public:
  explicit DrainOnUnwind(Stream& stream)
      : stream_(stream), exceptions_(std::uncaught_exceptions()) {}
  ~DrainOnUnwind();
  DrainOnUnwind(const DrainOnUnwind&) = delete;
  DrainOnUnwind& operator=(const DrainOnUnwind&) = delete;

 private:
  Stream& stream_;
  int exceptions_;  // in flight at construction: more at destruction means unwinding
};

// True iff `counter` has reached `value` in the cyclic order Stream::wait uses.
inline bool host_signal_reached(std::uint32_t counter, std::uint32_t value) {
  return static_cast<std::int32_t>(counter - value) >= 0;
}

}  // namespace zrt
