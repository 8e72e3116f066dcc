// A rank that withholds its call makes every other rank's collective fail with zrt::Timeout
// naming the operation and the missing rank, instead of hanging. The late rank joins afterwards so
// MPI can finish the abandoned operation and the test ends cleanly.
#include <catch2/catch.hpp>

#include <chrono>
#include <thread>

#include "runtime/common/error.h"
#include "tests/comm/collective_test_util.h"

using namespace zrt;
using namespace zrt::test;

TEST_CASE("a withheld collective times out on the other ranks with a clear error") {
  CommOptions o;
  o.timeout_s = 1.0;
  auto f = make_comm(o, "timeout");
  REQUIRE(f.size() >= 2);
  const bool late = f.rank() == f.size() - 1;
  const std::int64_t count = 1000;
  Buffer in = upload(*f.device, *f.stream, make_input(DType::kFloat32, f.rank(), 0, count, 3));
  Buffer out = upload(*f.device, *f.stream, {}, count * 4 * f.size());
  if (late) std::this_thread::sleep_for(std::chrono::milliseconds(3000));
  const auto start = std::chrono::steady_clock::now();
  f.group->all_gather(in.device<std::byte>(), out.device<std::byte>(), count, DType::kFloat32);
  if (late) {
    // Everyone else posted long ago: the operation completes for the late rank.
    f.stream->synchronize();
  } else {
    try {
      f.stream->synchronize();
      FAIL("expected a timeout");
    } catch (const Timeout& e) {
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      CHECK(waited >= 1.0);
      CHECK(waited < 2.9);  // failed on its own deadline, not because the late rank arrived
      CHECK_THAT(std::string(e.what()),
                 Catch::Contains("all_gather of 1000 x fp32 on group 'timeout'") &&
                     Catch::Contains("did not complete within 1.0 s (comm_timeout_s)"));
      // Attendance: the late rank is named as missing, every other rank as waiting too.
      std::string waiting;
      for (int r = 0; r < f.size() - 1; ++r) {
        if (r == f.rank()) continue;
        waiting += (waiting.empty() ? "ranks " : ", ") + std::to_string(r);
      }
      CHECK_THAT(std::string(e.what()),
                 Catch::Contains("ranks missing: " + std::to_string(f.size() - 1) + " (") &&
                     Catch::EndsWith("waiting in it too: " +
                                     (waiting.empty() ? std::string("no other rank") : waiting)));
    }
  }
  // The group's destructor completes the abandoned request once the late rank has joined.
}
