// The CPU backend's streams and events: each stream is an in-order queue run by one worker
// thread; events are shared completion objects, one per record, so a wait binds to the record
// that was latest when the wait was issued (CUDA's semantics, see stream.h).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>

#include "runtime/device/stream.h"

namespace zrt {

// One record of an event: completes when the stream reaches it, carrying the stream's error.
class CpuCompletion {
 public:
  void complete(std::exception_ptr error);
  // Blocks until complete; returns the error it completed with (null if none).
  std::exception_ptr wait();
  bool ready() const;

 private:
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

class CpuStream final : public Stream {
 public:
  // delay_max_us > 0 sleeps a random 0..delay_max_us before each work item (race detection).
  // on_destroy, if set, is called with this stream at the end of its destructor.
  CpuStream(std::string name, int delay_max_us, std::uint64_t seed,
            std::function<void(CpuStream*)> on_destroy = {});
  ~CpuStream() override;  // finishes all enqueued work, then joins the worker

  const std::string& name() const override { return name_; }
  void wait(const Event& event) override;
  void wait(const HostSignal& signal, std::uint32_t value) override;
  void synchronize() override;
  void host_callback(std::function<void()> fn) override;
  void trace_begin(TraceRecorder& recorder, TraceTrack track, std::string label) override;
  void trace_end() override;

  // Backend use (kernels, copies, collectives): runs `work` on the worker in stream order.
  // An exception thrown by work becomes the stream's sticky error.
  void enqueue(std::function<void()> work);
  // Completes `signal` when the stream reaches this point.
  void enqueue_signal(std::shared_ptr<CpuCompletion> signal);
  // Runs `release` in stream order even after the stream has failed (the failed and skipped
  // work no longer uses the memory it frees), as cudaFreeAsync frees after a failed host
  // callback: a stream-ordered Buffer release. Must not throw.
  void enqueue_release(std::function<void()> release);

 private:
  // A trace span boundary, handled by the worker in stream order.
  struct TraceMark {
    TraceRecorder* recorder = nullptr;  // null: the end of the open span
    TraceTrack track;
    std::string label;
  };
  struct Task {
    std::function<void()> work;
    std::shared_ptr<CpuCompletion> signal;  // complete after work
    std::shared_ptr<CpuCompletion> await;   // wait for before work
    bool is_callback = false;
    std::unique_ptr<TraceMark> trace;  // a span boundary (no work, signal or await)
    bool after_error = false;          // runs even once the stream has failed
  };
  // The span the worker is in: work items inside it are timed.
  struct OpenSpan {
    TraceRecorder* recorder = nullptr;  // null: no span open
    TraceTrack track;
    std::string label;
    double start_us = -1.0;  // of the first work item; < 0 until one ran
    double end_us = 0.0;     // of the last work item
  };
  void push(Task task);
  void run();
  void on_trace_mark(TraceMark& mark);  // worker only

  const std::string name_;
  const int delay_max_us_;
  std::mt19937_64 rng_;  // used by the worker only
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool stopping_ = false;
  std::exception_ptr error_;  // sticky; written by the worker only
  OpenSpan span_;             // worker only
  std::function<void(CpuStream*)> on_destroy_;
  std::thread worker_;
};

class CpuEvent final : public Event {
 public:
  void record(Stream& stream) override;
  void synchronize() override;
  bool query() const override;
  // The most recent record, or null if never recorded.
  std::shared_ptr<CpuCompletion> latest() const;

 private:
  mutable std::mutex mutex_;
  std::shared_ptr<CpuCompletion> latest_;
};

// The CPU backend's HostSignal: a counter under a mutex; a stream's wait is work on its worker
// that sleeps until the counter is reached.
class CpuHostSignal final : public HostSignal {
 public:
  CpuHostSignal();
  ~CpuHostSignal() override;
  void raise(std::uint32_t value) noexcept override;
  std::uint32_t value() const noexcept override;

 private:
  friend class CpuStream;  // its wait: note_wait, then wait_state on its worker
  // The counter and its condition variable, shared with pending stream waits.
  struct State;
  // Blocks the calling thread until the counter reaches `value`.
  static void wait_state(const State& state, std::uint32_t value);
  // What the destructor raises to: the highest value waited for so far.
  void note_wait(std::uint32_t value);

  std::shared_ptr<State> state_;
};

// Throws if called from inside a host callback (stream API calls are not allowed there).
void check_not_in_host_callback(const char* api);

// Returns the CPU stream behind `stream`, or throws naming `what` if it is another backend's.
CpuStream& as_cpu_stream(Stream& stream, const char* what);

}  // namespace zrt
