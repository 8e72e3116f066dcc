// The watchdog: reports from timed-out waits reach the handler once; the monitor thread
// reports a watched operation that outlives its timeout plus the grace, naming it and the step,
// and leaves alone operations that finish in time.
#include <catch2/catch.hpp>

#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/common/watchdog.h"

using namespace zrt;

namespace {
struct Recorder {
  std::mutex mutex;
  std::vector<std::string> messages;
  Watchdog::Handler handler() {
    return [this](const std::string& m) {
      std::lock_guard<std::mutex> lock(mutex);
      messages.push_back(m);
    };
  }
  std::size_t count() {
    std::lock_guard<std::mutex> lock(mutex);
    return messages.size();
  }
};
}  // namespace

TEST_CASE("a reported timeout calls the handler once") {
  Recorder r;
  Watchdog w(10.0, r.handler());
  CHECK(!w.has_expired());
  CHECK(w.step_phrase().empty());
  w.set_step(7);
  CHECK(w.step_phrase() == " at training step 7");
  w.expired("all_gather timed out");
  w.expired("a second report");
  CHECK(w.has_expired());
  REQUIRE(r.count() == 1);
  CHECK(r.messages[0] == "all_gather timed out");
}

TEST_CASE("the monitor reports an operation stuck past timeout + grace, with the step") {
  Recorder r;
  Watchdog w(0.3, r.handler(), 0.2);
  w.set_step(3);
  {
    const auto quick = w.watch("a quick barrier");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const auto start = std::chrono::steady_clock::now();
  const auto stuck = w.watch("all_gather of 10 x fp32 on group 'g'");
  while (r.count() == 0 && std::chrono::steady_clock::now() - start < std::chrono::seconds(5)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  REQUIRE(r.count() == 1);
  CHECK(waited >= 0.5);
  CHECK(waited < 1.5);
  CHECK_THAT(r.messages[0],
             Catch::StartsWith("all_gather of 10 x fp32 on group 'g' has been in "
                               "flight for") &&
                 Catch::Contains("at training step 3, beyond comm_timeout_s = 0.3 s"));
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  CHECK(r.count() == 1);  // reported once
}

TEST_CASE("without a handler reports are only logged") {
  Watchdog w(0.1, nullptr, 0.05);
  const auto stuck = w.watch("op");
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  CHECK(w.has_expired());
}
