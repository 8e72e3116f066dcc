// A rank that withholds its call makes every other rank's collective fail with zrt::Timeout
// naming the operation and the missing rank, instead of hanging. The late rank joins afterwards so
// MPI can finish the abandoned operation and the test ends cleanly.
#include <catch2/catch.hpp>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <mpi.h>

#include "runtime/comm/mpi_process_group.h"
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
  // The group's destructor completes the abandoned request once the late rank has joined: it
  // must go before the buffers the request writes into (ASan found the test freeing them first).
  f.group.reset();
}

// A reduce-scatter of two chunks posts the second chunk's exchange before waiting for the first:
// when the first times out, both chunks' requests are left to the group (abandoned), so its
// destructor waits for the late rank to complete them before freeing the communicator and the
// scratch they write into (before, the second chunk's were dropped: freed under live requests).
TEST_CASE("a timed-out reduce-scatter leaves every posted chunk to the group, none dropped") {
  CommOptions o;
  o.timeout_s = 1.0;
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  o.max_chunk_bytes = std::int64_t{4} * n * 64;  // 64 elements of each rank's slice a chunk
  auto f = make_comm(o, "timeout-chunks");
  REQUIRE(f.size() >= 2);
  auto* mpi = dynamic_cast<MpiProcessGroup*>(f.group.get());
  REQUIRE(mpi != nullptr);
  const bool late = f.rank() == f.size() - 1;
  const std::int64_t count = 128;  // per rank: two chunks of 64
  Buffer in = upload(*f.device, *f.stream, make_input(DType::kFloat32, f.rank(), 1, count * n, 3));
  Buffer out = upload(*f.device, *f.stream, {}, count * 4);
  if (late) std::this_thread::sleep_for(std::chrono::milliseconds(2000));
  f.group->reduce_scatter(in.device<std::byte>(), out.device<std::byte>(), count, DType::kFloat32,
                          ReduceOp::kSum);
  if (late) {
    f.stream->synchronize();  // everyone else posted both chunks long ago
    CHECK(mpi->abandoned_requests() == 0);
  } else {
    CHECK_THROWS_AS(f.stream->synchronize(), Timeout);
    // Both chunks' receives and sends, 2 x 2 per peer (MPI_Testall frees none unless all are
    // done), the second chunk's included, and the attendance's send to each peer.
    CHECK(mpi->abandoned_requests() == static_cast<std::size_t>((2 * 2 + 1) * (n - 1)));
  }
  f.group.reset();  // completes the abandoned requests once the late rank has joined
}

TEST_CASE("the watchdog reports a group creation that blocks past the timeout") {
  // MPI_Comm_dup cannot time out; the watchdog's monitor reports it (zrt-train would abort).
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  REQUIRE(size >= 2);
  std::vector<std::string> reports;
  std::mutex mutex;
  CommOptions o;
  o.timeout_s = 0.3;
  o.watchdog = std::make_shared<Watchdog>(
      o.timeout_s,
      [&](const std::string& m) {
        std::lock_guard<std::mutex> lock(mutex);
        reports.push_back(m);
      },
      0.3);
  const bool late = rank == size - 1;
  if (late) std::this_thread::sleep_for(std::chrono::milliseconds(2000));
  auto f = make_comm(o, "slow_start");
  std::lock_guard<std::mutex> lock(mutex);
  if (late) {
    CHECK(reports.empty());
  } else {
    REQUIRE(reports.size() == 1);
    CHECK_THAT(reports[0], Catch::StartsWith("MPI_Comm_dup creating group 'slow_start' has been "
                                             "in flight for") &&
                               Catch::Contains("beyond comm_timeout_s = 0.3 s"));
  }
}
