#include "runtime/common/watchdog.h"

#include <spdlog/spdlog.h>

namespace zrt {

using Clock = std::chrono::steady_clock;

Watchdog::Watchdog(double timeout_s, Handler on_expired, double grace_s)
    : timeout_s_(timeout_s), grace_s_(grace_s), on_expired_(std::move(on_expired)) {
  monitor_ = std::thread([this] { monitor(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  monitor_.join();
}

std::string Watchdog::step_phrase() const {
  const std::int64_t s = step();
  return s > 0 ? fmt::format(" at training step {}", s) : std::string();
}

Watchdog::Watch::~Watch() {
  if (!owner_) return;
  std::lock_guard<std::mutex> lock(owner_->mutex_);
  owner_->in_flight_.erase(it_);
}

Watchdog::Watch Watchdog::watch(std::string what) {
  std::lock_guard<std::mutex> lock(mutex_);
  in_flight_.push_back(Watch::Entry{std::move(what), Clock::now(), false});
  return Watch(this, std::prev(in_flight_.end()));
}

void Watchdog::expired(const std::string& message) {
  spdlog::error("watchdog: {}", message);
  if (expired_.exchange(true)) return;  // the first report ends the run; later ones only log
  if (on_expired_) {
    spdlog::default_logger()->flush();
    on_expired_(message);
  }
}

void Watchdog::monitor() {
  // Checks a few times per second; the limit is the operation's timeout plus the grace.
  const auto limit = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(timeout_s_ + grace_s_));
  const auto period = std::chrono::milliseconds(200);
  std::unique_lock<std::mutex> lock(mutex_);
  while (!cv_.wait_for(lock, period, [&] { return stopping_; })) {
    const auto now = Clock::now();
    for (Watch::Entry& e : in_flight_) {
      if (e.reported || now - e.start < limit) continue;
      e.reported = true;
      const std::string message = fmt::format(
          "{} has been in flight for {:.1f} s{}, beyond comm_timeout_s = {:.1f} s, and its own "
          "timeout did not fire (a blocking wait)",
          e.what, std::chrono::duration<double>(now - e.start).count(), step_phrase(), timeout_s_);
      lock.unlock();
      expired(message);
      lock.lock();
      break;  // the list may have changed while unlocked
    }
  }
}

}  // namespace zrt
