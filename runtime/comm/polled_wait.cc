#include "runtime/comm/polled_wait.h"

#include <thread>

#include "runtime/common/error.h"
#include "runtime/common/watchdog.h"

namespace zrt::detail {

using Clock = std::chrono::steady_clock;

PollSchedule::PollSchedule(double timeout_s, PollPace pace)
    : deadline_(Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>(timeout_s))),
      pace_(pace) {}

bool PollSchedule::expired_after_pending_test() {
  const unsigned tests = ++tests_;
  if (pace_ == PollPace::kSpin) {
    // Reading the clock costs about as much as an MPI test: only every 64th test does.
    if ((tests & 63u) != 0) return false;
    if (Clock::now() > deadline_) return true;
    std::this_thread::yield();
    return false;
  }
  if (Clock::now() > deadline_) return true;
  if (tests <= 64) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(tests <= 4096 ? 20 : 200));
  }
  return false;
}

void report_timeout(Watchdog* watchdog, const std::string& message) {
  if (watchdog != nullptr) watchdog->expired(message);
  throw Timeout(__FILE__, __LINE__, message);
}

}  // namespace zrt::detail
