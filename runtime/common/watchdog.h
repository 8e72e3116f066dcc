// Watchdog: makes sure a run that stops making progress ends, with a message saying where.
//
// Waits that poll (every MPI collective) detect their own timeout (comm_timeout_s); they
// report it here with the operation, the ranks missing and the training step the watchdog
// knows, and the watchdog logs it and calls the handler the tool installed (zrt-train's ends
// the job with MPI_Abort). A wait that cannot poll, or a poll that itself blocks, is caught
// by the watchdog's monitor thread: a watched operation still in flight `grace_s` after its
// own deadline is reported the same way. The library never ends the process itself: with no
// handler, reports are only logged and the waits throw zrt::Timeout as usual.
//
// Thread-safe: any thread may watch, report or set the step.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <mutex>
#include <string>
#include <thread>

namespace zrt {

class Watchdog {
 public:
  using Handler = std::function<void(const std::string& message)>;

  // `timeout_s`: how long one operation may take (comm_timeout_s); `grace_s`: how much longer
  // the monitor waits before reporting a watched operation whose own timeout did not fire.
  // on_expired runs at most once, on the reporting thread; it may end the process.
  Watchdog(double timeout_s, Handler on_expired, double grace_s = 5.0);
  ~Watchdog();  // stops the monitor thread
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  double timeout_s() const { return timeout_s_; }
  // The training step in progress (0 before the first), named in every report.
  void set_step(std::int64_t step) { step_.store(step, std::memory_order_relaxed); }
  std::int64_t step() const { return step_.load(std::memory_order_relaxed); }
  // " at step N" when a step is in progress, else "".
  std::string step_phrase() const;

  // An operation in flight, watched by the monitor until the Watch is destroyed.
  class Watch {
   public:
    Watch() = default;
    Watch(Watch&& other) noexcept : owner_(other.owner_), it_(other.it_) { other.owner_ = nullptr; }
    Watch& operator=(Watch&&) = delete;
    ~Watch();

   private:
    friend class Watchdog;
    struct Entry {
      std::string what;
      std::chrono::steady_clock::time_point start;
      bool reported = false;
    };
    Watch(Watchdog* owner, std::list<Entry>::iterator it) : owner_(owner), it_(it) {}
    Watchdog* owner_ = nullptr;
    std::list<Entry>::iterator it_;
  };
  // Starts watching `what` (e.g. "all_gather of 1000 x fp32 on group 'zero'").
  [[nodiscard]] Watch watch(std::string what);

  // A wait that timed out on its own reports here: logs `message` as an error and calls the
  // handler (the first time only). Returns normally when there is no handler.
  void expired(const std::string& message);
  // Returns true iff something was reported.
  bool has_expired() const { return expired_.load(); }

 private:
  void monitor();

  const double timeout_s_;
  const double grace_s_;
  const Handler on_expired_;
  std::atomic<std::int64_t> step_{0};
  std::atomic<bool> expired_{false};
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::list<Watch::Entry> in_flight_;
  std::thread monitor_;
};

}  // namespace zrt
