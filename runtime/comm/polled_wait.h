// The polled wait every nonblocking operation of zrt goes through: the MPI group's collectives,
// the NCCL group's enqueues, bootstrap and stream drains, and the checkpointer's agreements.
//
// A blocking wait cannot time out, and OpenMPI 4.1 has no progress thread (a request advances
// only inside MPI_Test), so zrt never blocks: it tests the request over and over until it is
// done, and gives up at comm_timeout_s with a zrt::Timeout whose text says what was waited for.
// The watchdog, when there is one, is told first (it names the step and may end the run).
//
// Usage:
//   polled_wait({timeout_s, PollPace::kSpin, watchdog}, [&] { return test_request(); },
//               [&] { return fmt::format("{} did not complete ...", what); });
#pragma once

#include <chrono>
#include <string>

namespace zrt {

class Watchdog;

// How often a pending operation is tested.
enum class PollPace {
  // Back to back, yielding every 64 tests: an MPI transfer advances only while it is being
  // tested, so the collectives' bandwidth depends on testing without pause.
  kSpin,
  // Yield for the first 64 tests (most operations finish at once), then sleep 20 us, and 200 us
  // once 4096 tests have passed: for waits whose progress does not need the caller's CPU (NCCL
  // enqueues and GPU streams) or that are rare (the checkpointer's agreements).
  kBackoff,
};

struct PollOptions {
  double timeout_s = 600.0;  // give up after this long (comm_timeout_s)
  PollPace pace = PollPace::kSpin;
  // Told about a timeout before Timeout is thrown (Watchdog::expired); may be null.
  Watchdog* watchdog = nullptr;
};

namespace detail {

// The wait's clock and pacing; see PollPace.
class PollSchedule {
 public:
  PollSchedule(double timeout_s, PollPace pace);
  // Called after a test found the operation pending: returns true once the deadline has
  // passed, otherwise paces the next test (yield or sleep, per the pace) and returns false.
  bool expired_after_pending_test();

 private:
  std::chrono::steady_clock::time_point deadline_;
  PollPace pace_;
  unsigned tests_ = 0;
};

// Tells the watchdog (if any) and throws Timeout carrying `message`.
[[noreturn]] void report_timeout(Watchdog* watchdog, const std::string& message);

}  // namespace detail

// Tests `is_done()` (returning bool; it may throw) until it returns true or `timeout_s` pass.
// Returns whether it finished. For waits that give up quietly (a destructor, a best-effort
// exchange).
template <typename IsDone>
bool poll_until_done(double timeout_s, PollPace pace, IsDone&& is_done) {
  detail::PollSchedule schedule(timeout_s, pace);
  while (!is_done()) {
    if (schedule.expired_after_pending_test()) return false;
  }
  return true;
}

// Tests `is_done()` until it returns true. If options.timeout_s pass first, calls
// `timeout_message()` (std::string; it may also give up resources the operation holds, e.g.
// abandon its requests), tells options.watchdog and throws zrt::Timeout with that text.
template <typename IsDone, typename TimeoutMessage>
void polled_wait(const PollOptions& options, IsDone&& is_done, TimeoutMessage&& timeout_message) {
  if (!poll_until_done(options.timeout_s, options.pace, is_done)) {
    detail::report_timeout(options.watchdog, timeout_message());
  }
}

}  // namespace zrt
