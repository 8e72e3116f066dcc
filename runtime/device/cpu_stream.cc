#include "runtime/device/cpu_stream.h"

#include <chrono>

#include "runtime/common/error.h"
#include "runtime/trace/trace_recorder.h"

namespace zrt {

namespace {
thread_local bool t_in_host_callback = false;
}  // namespace

void check_not_in_host_callback(const char* api) {
  ZRT_CHECK(!t_in_host_callback,
            "{} called from a host callback; host callbacks may not call "
            "the stream API (as in CUDA)",
            api);
}

CpuStream& as_cpu_stream(Stream& stream, const char* what) {
  auto* cpu = dynamic_cast<CpuStream*>(&stream);
  ZRT_CHECK(cpu != nullptr, "{}: stream '{}' is not a CPU stream", what, stream.name());
  return *cpu;
}

void CpuCompletion::complete(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
    error_ = std::move(error);
  }
  cv_.notify_all();
}

std::exception_ptr CpuCompletion::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return done_; });
  return error_;
}

bool CpuCompletion::ready() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_;
}

CpuStream::CpuStream(std::string name, int delay_max_us, std::uint64_t seed,
                     std::function<void(CpuStream*)> on_destroy)
    : name_(std::move(name)),
      delay_max_us_(delay_max_us),
      rng_(seed ^ std::hash<std::string>{}(name_)),
      on_destroy_(std::move(on_destroy)),
      worker_([this] { run(); }) {}

CpuStream::~CpuStream() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  worker_.join();
  if (on_destroy_) on_destroy_(this);
}

void CpuStream::push(Task task) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
}

void CpuStream::enqueue(std::function<void()> work) {
  check_not_in_host_callback("Stream work");
  push(Task{std::move(work), nullptr, nullptr, false, nullptr});
}

void CpuStream::enqueue_signal(std::shared_ptr<CpuCompletion> signal) {
  check_not_in_host_callback("Event::record");
  push(Task{nullptr, std::move(signal), nullptr, false, nullptr});
}

void CpuStream::enqueue_release(std::function<void()> release) {
  check_not_in_host_callback("Buffer release");
  Task task{std::move(release), nullptr, nullptr, false, nullptr};
  task.after_error = true;
  push(std::move(task));
}

void CpuStream::wait(const Event& event) {
  check_not_in_host_callback("Stream::wait");
  const auto* cpu_event = dynamic_cast<const CpuEvent*>(&event);
  ZRT_CHECK(cpu_event != nullptr, "stream '{}' cannot wait on an event of another backend", name_);
  auto latest = cpu_event->latest();
  if (!latest) return;  // never recorded: a no-op, as in CUDA
  push(Task{nullptr, nullptr, std::move(latest), false, nullptr});
}

void CpuStream::wait(const HostSignal& signal, std::uint32_t value) {
  check_not_in_host_callback("Stream::wait");
  const auto* cpu_signal = dynamic_cast<const CpuHostSignal*>(&signal);
  ZRT_CHECK(cpu_signal != nullptr, "stream '{}' cannot wait on a host signal of another backend",
            name_);
  const_cast<CpuHostSignal*>(cpu_signal)->note_wait(value);
  std::shared_ptr<CpuHostSignal::State> state = cpu_signal->state_;
  push(Task{[state, value] { CpuHostSignal::wait_state(*state, value); }, nullptr, nullptr, false,
            nullptr});
}

void CpuStream::synchronize() {
  check_not_in_host_callback("Stream::synchronize");
  auto done = std::make_shared<CpuCompletion>();
  push(Task{nullptr, done, nullptr, false, nullptr});
  if (auto error = done->wait()) std::rethrow_exception(error);
}

void CpuStream::host_callback(std::function<void()> fn) {
  check_not_in_host_callback("Stream::host_callback");
  push(Task{std::move(fn), nullptr, nullptr, true, nullptr});
}

void CpuStream::trace_begin(TraceRecorder& recorder, TraceTrack track, std::string label) {
  check_not_in_host_callback("Stream::trace_begin");
  push(Task{nullptr, nullptr, nullptr, false,
            std::make_unique<TraceMark>(TraceMark{&recorder, track, std::move(label)})});
}

void CpuStream::trace_end() {
  check_not_in_host_callback("Stream::trace_end");
  push(Task{nullptr, nullptr, nullptr, false,
            std::make_unique<TraceMark>(TraceMark{nullptr, TraceTrack::kCompute, {}})});
}

void CpuStream::on_trace_mark(TraceMark& mark) {
  // Close the open span (a begin ends it too: spans do not nest); a span without work is dropped.
  if (span_.recorder != nullptr && span_.start_us >= 0.0) {
    span_.recorder->add(span_.track, std::move(span_.label), span_.start_us,
                        span_.end_us - span_.start_us);
  }
  span_ = OpenSpan{};
  if (mark.recorder != nullptr) {
    span_.recorder = mark.recorder;
    span_.track = mark.track;
    span_.label = std::move(mark.label);
  }
}

void CpuStream::run() {
  std::uniform_int_distribution<int> delay(0, delay_max_us_ > 0 ? delay_max_us_ : 0);
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    if (task.trace) {
      on_trace_mark(*task.trace);
      continue;
    }
    if (delay_max_us_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay(rng_)));
    if (task.await) {
      // An error on the stream we wait for poisons this one too, as a CUDA sticky error would.
      if (auto upstream = task.await->wait(); upstream && !error_) error_ = upstream;
    }
    if (task.work && task.after_error && error_) {
      task.work();  // a release after a failure: untimed, and it does not throw
    } else if (task.work && !error_) {
      // Tracing: the only cost when off is this null check.
      const bool timed = span_.recorder != nullptr;
      const double start_us = timed ? span_.recorder->now_us() : 0.0;
      t_in_host_callback = task.is_callback;
      try {
        task.work();
      } catch (...) {
        error_ = std::current_exception();
      }
      t_in_host_callback = false;
      if (timed) {
        if (span_.start_us < 0.0) span_.start_us = start_us;
        span_.end_us = span_.recorder->now_us();
      }
    }
    if (task.signal) task.signal->complete(error_);
  }
}

void CpuEvent::record(Stream& stream) {
  check_not_in_host_callback("Event::record");
  auto completion = std::make_shared<CpuCompletion>();
  as_cpu_stream(stream, "Event::record").enqueue_signal(completion);
  std::lock_guard<std::mutex> lock(mutex_);
  latest_ = std::move(completion);
}

void CpuEvent::synchronize() {
  check_not_in_host_callback("Event::synchronize");
  if (auto latest = this->latest()) {
    if (auto error = latest->wait()) std::rethrow_exception(error);
  }
}

bool CpuEvent::query() const {
  auto latest = this->latest();
  return !latest || latest->ready();
}

std::shared_ptr<CpuCompletion> CpuEvent::latest() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return latest_;
}

// ---- CpuHostSignal ---------------------------------------------------------------------------

struct CpuHostSignal::State {
  mutable std::mutex mutex;
  mutable std::condition_variable cv;
  std::uint32_t counter = 0;
  std::uint32_t waited_max = 0;
  bool waited = false;
};

CpuHostSignal::CpuHostSignal() : state_(std::make_shared<State>()) {}

CpuHostSignal::~CpuHostSignal() {
  std::uint32_t to = 0;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (!state_->waited || host_signal_reached(state_->counter, state_->waited_max)) return;
    to = state_->waited_max;
  }
  raise(to);
}

void CpuHostSignal::raise(std::uint32_t value) noexcept {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->counter = value;
  }
  state_->cv.notify_all();
}

std::uint32_t CpuHostSignal::value() const noexcept {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->counter;
}

void CpuHostSignal::wait_state(const State& state, std::uint32_t value) {
  std::unique_lock<std::mutex> lock(state.mutex);
  state.cv.wait(lock, [&] { return host_signal_reached(state.counter, value); });
}

void CpuHostSignal::note_wait(std::uint32_t value) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (!state_->waited || host_signal_reached(value, state_->waited_max)) state_->waited_max = value;
  state_->waited = true;
}

}  // namespace zrt
