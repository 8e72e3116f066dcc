// Large host buffers made resident up front (runtime/device/host_memory.h) and the CPU device's
// pinned memory built on them: every page resident and zero when the mapping returns (mincore),
// failures reported instead of thrown, the fills exact at every size, offset and thread count,
// and the buffers released in stream order.
#include <catch2/catch.hpp>

#include <omp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "runtime/device/device.h"
#include "runtime/device/host_memory.h"

namespace zrt {
namespace {

std::size_t page() {
  return static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
}

// How many of the pages of [ptr, ptr + bytes) are resident.
std::size_t resident_pages(const void* ptr, std::size_t bytes) {
  const std::size_t pages = (bytes + page() - 1) / page();
  std::vector<unsigned char> in_core(pages);
  REQUIRE(mincore(const_cast<void*>(ptr), bytes, in_core.data()) == 0);
  return static_cast<std::size_t>(
      std::count_if(in_core.begin(), in_core.end(), [](unsigned char c) { return c & 1; }));
}

bool all_zero(const void* ptr, std::size_t bytes) {
  const auto* b = static_cast<const unsigned char*>(ptr);
  return std::all_of(b, b + bytes, [](unsigned char c) { return c == 0; });
}

TEST_CASE("resident host pages are mapped, zero and resident when they return") {
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    // Whole pages, a size that is not, and one over the multi-thread threshold.
    for (std::size_t bytes : {page(), 3 * page() + 17, (std::size_t{130} << 20) + 5}) {
      INFO(threads << " thread(s), " << bytes << " bytes");
      std::string error;
      void* p = map_resident_host_pages(bytes, &error);
      REQUIRE(p != nullptr);
      CHECK(error.empty());
      CHECK(reinterpret_cast<std::uintptr_t>(p) % page() == 0);
      // Resident without our touching them again: the mapping faulted them in.
      CHECK(resident_pages(p, bytes) == (bytes + page() - 1) / page());
      CHECK(all_zero(p, bytes));
      std::memset(p, 0x5a, bytes);  // writable to the last byte
      unmap_resident_host_pages(p, bytes);
    }
  }
  omp_set_num_threads(2);
}

// This process's anonymous resident memory, from /proc/self/status (kB).
std::int64_t rss_anon_kb() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("RssAnon:", 0) == 0) return std::stoll(line.substr(8));
  }
  FAIL("no RssAnon in /proc/self/status");
  return 0;
}

// A frozen unit's optimizer state in a checkpoint's view of the engine (ZeroEngine::host_state):
// zeros as large as the slice, at no cost in memory.
TEST_CASE("zero host pages read as zeros and cost no resident memory") {
  const std::size_t bytes = std::size_t{256} << 20;
  const std::int64_t before = rss_anon_kb();
  ZeroHostPages zeros(bytes);
  REQUIRE(zeros.data() != nullptr);
  CHECK(zeros.bytes() == bytes);
  // Every byte read (the kernel maps its one zero page for each).
  CHECK(all_zero(zeros.data(), bytes));
  const std::int64_t grown_kb = rss_anon_kb() - before;
  INFO("RssAnon grew by " << grown_kb << " kB reading " << (bytes >> 10) << " kB");
  CHECK(grown_kb < static_cast<std::int64_t>(bytes >> 10) / 16);
  // Moves hand the mapping over; an empty one maps nothing.
  ZeroHostPages moved(std::move(zeros));
  CHECK(zeros.data() == nullptr);
  CHECK(moved.bytes() == bytes);
  CHECK(ZeroHostPages(0).data() == nullptr);
  CHECK_THROWS_WITH(ZeroHostPages(std::numeric_limits<std::size_t>::max() / 2),
                    Catch::Contains("read-only zero mapping of"));
}

TEST_CASE("a mapping the system cannot give is reported, not thrown") {
  std::string error;
  void* p = map_resident_host_pages(std::numeric_limits<std::size_t>::max() / 2, &error);
  CHECK(p == nullptr);
  CHECK_THAT(error, Catch::Contains("mmap of") && Catch::Contains("failed"));
}

TEST_CASE("host passes use one thread per 64 MiB, up to the team") {
  omp_set_num_threads(3);
  CHECK(host_pass_threads(0) == 1);
  CHECK(host_pass_threads(std::size_t{64} << 20) == 1);
  CHECK(host_pass_threads(std::size_t{128} << 20) == 2);
  CHECK(host_pass_threads(std::size_t{1} << 40) == 3);
  omp_set_num_threads(2);
}

TEST_CASE("parallel_fill_zero zeroes exactly its range at every size, offset and thread count") {
  const std::size_t capacity = (std::size_t{128} << 20) + 256;
  std::vector<unsigned char> buffer(capacity);
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    for (std::size_t offset : {std::size_t{0}, std::size_t{1}, std::size_t{63}}) {
      for (std::size_t bytes :
           {std::size_t{0}, std::size_t{1}, std::size_t{4097}, (std::size_t{128} << 20) + 3}) {
        INFO(threads << " thread(s), offset " << offset << ", " << bytes << " bytes");
        std::fill(buffer.begin(), buffer.end(), 0xee);
        parallel_fill_zero(buffer.data() + offset, bytes);
        CHECK(all_zero(buffer.data() + offset, bytes));
        // Nothing outside the range.
        CHECK(std::all_of(buffer.begin(), buffer.begin() + static_cast<std::ptrdiff_t>(offset),
                          [](unsigned char c) { return c == 0xee; }));
        CHECK(std::all_of(buffer.begin() + static_cast<std::ptrdiff_t>(offset + bytes),
                          buffer.end(), [](unsigned char c) { return c == 0xee; }));
      }
    }
  }
  omp_set_num_threads(2);
}

TEST_CASE("the CPU device's large pinned buffers are resident pages, released in stream order") {
  DeviceOptions options;
  options.type = DeviceType::kCpu;
  auto device = make_device(options);
  auto stream = device->create_stream("s");
  const std::int64_t large = static_cast<std::int64_t>(kResidentHostMinBytes) + 1000;
  {
    Buffer pinned = device->allocate(large, MemCategory::kOptimizer, "moments",
                                     MemorySpace::kPinnedHost, stream.get());
    CHECK(resident_pages(pinned.host<std::byte>(), static_cast<std::size_t>(large)) ==
          (static_cast<std::size_t>(large) + page() - 1) / page());
    // Fresh pages read as zero; ZRT_POISON_ALLOCATIONS (make_device) fills them with 0xFF.
    const bool poisoned = poison_allocations_from_env();
    const auto* bytes = reinterpret_cast<const unsigned char*>(pinned.host<std::byte>());
    CHECK(std::all_of(bytes, bytes + large,
                      [&](unsigned char c) { return c == (poisoned ? 0xFF : 0x00); }));
    CHECK(device->tracker().usage(MemorySpace::kPinnedHost).total_current == large);
    // Work on the stream reads it after the release is asked for: the unmap waits for it.
    Buffer target = device->allocate(large, MemCategory::kOptimizer, "target");
    std::memset(pinned.host<std::byte>(), 7, static_cast<std::size_t>(large));
    device->copy_to_device(target.device<std::byte>(), pinned.host<std::byte>(),
                           static_cast<std::size_t>(large), *stream);
    pinned.reset();
    std::vector<unsigned char> back(static_cast<std::size_t>(large));
    device->copy_to_host(back.data(), target.device<std::byte>(), back.size(), *stream);
    stream->synchronize();
    CHECK(std::all_of(back.begin(), back.end(), [](unsigned char c) { return c == 7; }));
  }
  CHECK(device->tracker().usage(MemorySpace::kPinnedHost).total_current == 0);
  // Below the threshold and pageable: the allocator, as before.
  for (MemorySpace space : {MemorySpace::kPinnedHost, MemorySpace::kPageableHost}) {
    Buffer small = device->allocate(4096, MemCategory::kWorkspace, "small", space);
    CHECK(reinterpret_cast<std::uintptr_t>(small.host<std::byte>()) % 256 == 0);
  }
  device->synchronize();
}

}  // namespace
}  // namespace zrt
