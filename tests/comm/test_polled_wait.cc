// The polled wait (runtime/comm/polled_wait.h) with a fake request: it returns as soon as the
// request completes, throws Timeout with the caller's text at the deadline (after telling the
// watchdog), lets the test's own errors through, and paces its tests as documented.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "runtime/comm/polled_wait.h"
#include "runtime/common/error.h"
#include "runtime/common/watchdog.h"

using namespace zrt;
using Clock = std::chrono::steady_clock;

namespace {

// A nonblocking request that completes after `tests_needed` tests.
struct FakeRequest {
  int tests_needed = 0;
  int tests = 0;
  bool test() { return ++tests >= tests_needed; }
};

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

TEST_CASE("the polled wait returns once the request completes") {
  for (PollPace pace : {PollPace::kSpin, PollPace::kBackoff}) {
    FakeRequest request{200};
    bool timed_out = false;
    polled_wait(
        {10.0, pace, nullptr}, [&] { return request.test(); },
        [&] {
          timed_out = true;
          return std::string("unused");
        });
    CHECK(request.tests == 200);
    CHECK(!timed_out);
  }
  // Done at the first test: no pacing at all.
  FakeRequest at_once{1};
  polled_wait(
      {0.001, PollPace::kBackoff, nullptr}, [&] { return at_once.test(); },
      [] { return std::string("unused"); });
  CHECK(at_once.tests == 1);
}

TEST_CASE("a request still pending at the deadline throws Timeout with the caller's text") {
  for (PollPace pace : {PollPace::kSpin, PollPace::kBackoff}) {
    int messages = 0;
    const auto start = Clock::now();
    try {
      polled_wait(
          {0.2, pace, nullptr}, [] { return false; },
          [&] {
            ++messages;
            return std::string("all_gather of 8 x fp32 did not complete within 0.2 s");
          });
      FAIL("expected a timeout");
    } catch (const Timeout& e) {
      CHECK_THAT(std::string(e.what()),
                 Catch::EndsWith(": all_gather of 8 x fp32 did not complete within 0.2 s"));
    }
    const double waited = seconds_since(start);
    CHECK(waited >= 0.2);
    CHECK(waited < 2.0);
    CHECK(messages == 1);  // the text (and any clean-up in it) is made once, at the timeout
  }
}

TEST_CASE("a timeout is reported to the watchdog before it is thrown") {
  std::mutex mutex;
  std::vector<std::string> reports;
  Watchdog watchdog(
      0.1,
      [&](const std::string& m) {
        std::lock_guard<std::mutex> lock(mutex);
        reports.push_back(m);
      },
      60.0);
  bool reported_before_throw = false;
  try {
    polled_wait(
        {0.1, PollPace::kBackoff, &watchdog}, [] { return false; },
        [] { return std::string("barrier on group 'g' did not complete"); });
  } catch (const Timeout&) {
    std::lock_guard<std::mutex> lock(mutex);
    reported_before_throw = reports.size() == 1;
  }
  CHECK(reported_before_throw);
  CHECK(watchdog.has_expired());
  std::lock_guard<std::mutex> lock(mutex);
  REQUIRE(reports.size() == 1);
  CHECK(reports[0] == "barrier on group 'g' did not complete");
}

TEST_CASE("an error from the test itself goes through unchanged") {
  int tests = 0;
  CHECK_THROWS_WITH(polled_wait(
                        {10.0, PollPace::kSpin, nullptr},
                        [&]() -> bool {
                          if (++tests == 3) throw std::runtime_error("MPI_Testall failed");
                          return false;
                        },
                        [] { return std::string("unused"); }),
                    "MPI_Testall failed");
  CHECK(tests == 3);
}

TEST_CASE("poll_until_done reports whether the request finished, without throwing") {
  FakeRequest request{50};
  CHECK(poll_until_done(10.0, PollPace::kSpin, [&] { return request.test(); }));
  const auto start = Clock::now();
  CHECK(!poll_until_done(0.05, PollPace::kBackoff, [] { return false; }));
  CHECK(seconds_since(start) >= 0.05);
}

TEST_CASE("the backoff pace sleeps between tests once the first 64 have passed") {
  // 64 yields, then 20 us sleeps: 2000 tests take at least (2000 - 65) * 20 us = 39 ms, where
  // the spin pace (no sleeps) does not rely on the scheduler at all.
  FakeRequest request{2000};
  const auto start = Clock::now();
  polled_wait(
      {10.0, PollPace::kBackoff, nullptr}, [&] { return request.test(); },
      [] { return std::string("unused"); });
  CHECK(seconds_since(start) >= 0.038);
}
