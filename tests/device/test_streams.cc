// CPU streams and events: ordering, CUDA event semantics, sticky errors, and the random-delay
// injection that turns a missing wait into a wrong result.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <future>
#include <stdexcept>
#include <thread>
#include <vector>

#include "runtime/common/error.h"
#include "runtime/device/cpu_stream.h"
#include "runtime/device/device.h"

using namespace zrt;
using namespace std::chrono_literals;

namespace {
std::unique_ptr<Device> cpu(int delay_us = 0, std::uint64_t seed = 1) {
  DeviceOptions o;
  o.stream_delay_max_us = delay_us;
  o.stream_delay_seed = seed;
  return make_device(o);
}
CpuStream& worker(Stream& s) {
  return as_cpu_stream(s, "test");
}
}  // namespace

TEST_CASE("work on one stream runs in order") {
  auto dev = cpu(20);
  auto s = dev->create_stream("s");
  std::vector<int> seen;
  for (int i = 0; i < 200; ++i) worker(*s).enqueue([&seen, i] { seen.push_back(i); });
  s->synchronize();
  REQUIRE(seen.size() == 200);
  for (int i = 0; i < 200; ++i) REQUIRE(seen[i] == i);
}

TEST_CASE("an event orders work across streams") {
  auto dev = cpu();
  auto a = dev->create_stream("a");
  auto b = dev->create_stream("b");
  auto e = dev->create_event();
  std::atomic<int> value{0};
  int observed = -1;
  worker(*a).enqueue([&] {
    std::this_thread::sleep_for(20ms);
    value = 42;
  });
  e->record(*a);
  b->wait(*e);
  worker(*b).enqueue([&] { observed = value.load(); });
  b->synchronize();
  CHECK(observed == 42);
  CHECK(e->query());
}

TEST_CASE("a wait binds to the record that was latest when the wait was issued") {
  auto dev = cpu();
  auto a = dev->create_stream("a");
  auto b = dev->create_stream("b");
  auto e = dev->create_event();
  std::promise<void> release;
  auto released = release.get_future().share();
  worker(*a).enqueue([] {});
  e->record(*a);  // record 1: completes at once
  b->wait(*e);    // binds to record 1
  worker(*a).enqueue([released] { released.wait(); });
  e->record(*a);  // record 2: blocked until release
  // b must finish although record 2 has not completed.
  auto done = std::async(std::launch::async, [&] { b->synchronize(); });
  CHECK(done.wait_for(5s) == std::future_status::ready);
  CHECK_FALSE(e->query());  // query reflects the latest record
  release.set_value();
  e->synchronize();
  CHECK(e->query());
  done.get();
}

TEST_CASE("waiting on a never-recorded event is a no-op") {
  auto dev = cpu();
  auto s = dev->create_stream("s");
  auto e = dev->create_event();
  CHECK(e->query());
  e->synchronize();
  s->wait(*e);
  bool ran = false;
  worker(*s).enqueue([&] { ran = true; });
  s->synchronize();
  CHECK(ran);
}

TEST_CASE("host callbacks run in order and may not call the stream API") {
  auto dev = cpu();
  auto s = dev->create_stream("s");
  std::vector<int> order;
  worker(*s).enqueue([&] { order.push_back(1); });
  s->host_callback([&] { order.push_back(2); });
  worker(*s).enqueue([&] { order.push_back(3); });
  s->synchronize();
  CHECK(order == std::vector<int>{1, 2, 3});

  auto other = dev->create_stream("other");
  auto e = dev->create_event();
  s->host_callback([&] { e->record(*other); });
  CHECK_THROWS_WITH(s->synchronize(), Catch::Contains("Event::record called from a host "
                                                      "callback"));
}

TEST_CASE("an error in stream work is sticky and propagates through events") {
  auto dev = cpu();
  auto a = dev->create_stream("a");
  auto b = dev->create_stream("b");
  auto e = dev->create_event();
  bool later_ran = false;
  worker(*a).enqueue([] { ZRT_THROW(Error, "simulated collective failure"); });
  worker(*a).enqueue([&] { later_ran = true; });
  e->record(*a);
  CHECK_THROWS_WITH(e->synchronize(), Catch::Contains("simulated collective failure"));
  CHECK_THROWS_WITH(a->synchronize(), Catch::Contains("simulated collective failure"));
  CHECK_FALSE(later_ran);
  b->wait(*e);
  CHECK_THROWS_WITH(b->synchronize(), Catch::Contains("simulated collective failure"));
}

TEST_CASE("copies and fills are stream-ordered") {
  auto dev = cpu(50);
  auto s = dev->create_stream("copy");
  const std::size_t n = 1000;
  std::vector<float> src(n), back(n, -1.0f);
  for (std::size_t i = 0; i < n; ++i) src[i] = static_cast<float>(i) * 0.5f;
  Buffer d1 = dev->allocate(n * 4, MemCategory::kParams, "d1");
  Buffer d2 = dev->allocate(n * 4, MemCategory::kParams, "d2");
  dev->copy_to_device(d1.device<std::byte>(), src.data(), n * 4, *s);
  dev->copy(d2.device<std::byte>(), d1.device<std::byte>(), n * 4, *s);
  dev->fill_zero(d1.device<std::byte>(), n * 4, *s);
  dev->copy_to_host(back.data(), d2.device<std::byte>(), n * 4, *s);
  s->synchronize();
  CHECK(back == src);
  dev->copy_to_host(back.data(), d1.device<std::byte>(), n * 4, *s);
  dev->synchronize();
  CHECK(back == std::vector<float>(n, 0.0f));
}

TEST_CASE("stream-ordered release waits for work already enqueued") {
  auto dev = cpu();
  auto s = dev->create_stream("s");
  std::vector<float> out(256, 0.0f);
  {
    Buffer b =
        dev->allocate(256 * 4, MemCategory::kWorkspace, "ordered", MemorySpace::kDevice, s.get());
    std::vector<float> ones(256, 1.0f);
    worker(*s).enqueue([] { std::this_thread::sleep_for(10ms); });
    dev->copy_to_device(b.device<std::byte>(), ones.data(), 256 * 4, *s);
    dev->copy_to_host(out.data(), b.device<std::byte>(), 256 * 4, *s);
    s->synchronize();
  }  // released here, ordered after the copies (ASan would flag a use after free otherwise)
  CHECK(dev->tracker().usage(MemorySpace::kDevice).total_current == 0);
  s->synchronize();
  CHECK(out == std::vector<float>(256, 1.0f));
}

// The producer fills a buffer on stream A; the consumer copies it on stream B. With the wait,
// every trial is right even with random delays; without it, delays expose the race.
namespace {
int wrong_results(Device& dev, bool with_wait, int trials) {
  auto a = dev.create_stream("producer");
  auto b = dev.create_stream("consumer");
  auto ready = dev.create_event();
  const std::size_t n = 4096;
  Buffer buf = dev.allocate(n * 4, MemCategory::kWorkspace, "race");
  std::vector<float> zeros(n, 0.0f), ones(n, 1.0f), out(n);
  int wrong = 0;
  for (int t = 0; t < trials; ++t) {
    dev.copy_to_device(buf.device<std::byte>(), zeros.data(), n * 4, *a);
    a->synchronize();
    worker(*a).enqueue([] {});  // one more delayed item before the fill
    dev.copy_to_device(buf.device<std::byte>(), ones.data(), n * 4, *a);
    ready->record(*a);
    if (with_wait) b->wait(*ready);
    dev.copy_to_host(out.data(), buf.device<std::byte>(), n * 4, *b);
    b->synchronize();
    a->synchronize();
    if (out != ones) ++wrong;
  }
  return wrong;
}
}  // namespace

TEST_CASE("random stream delays expose a missing event wait") {
  auto dev = cpu(/*delay_us=*/300, /*seed=*/7);
  CHECK(wrong_results(*dev, /*with_wait=*/true, 40) == 0);
#if defined(__SANITIZE_THREAD__)
  WARN("ThreadSanitizer build: the deliberately racy half of this test is skipped");
#else
  CHECK(wrong_results(*dev, /*with_wait=*/false, 40) > 0);
#endif
}

TEST_CASE("a host signal holds a stream until a host thread raises it far enough") {
  CHECK(host_signal_reached(5, 5));
  CHECK(host_signal_reached(6, 5));
  CHECK_FALSE(host_signal_reached(4, 5));
  CHECK(host_signal_reached(1, 0xffffffffu));  // cyclic: 1 comes after 2^32 - 1
  CHECK_FALSE(host_signal_reached(0xffffffffu, 1));

  auto dev = cpu(20);
  auto signal = dev->create_host_signal();
  CHECK(signal->value() == 0);
  auto s = dev->create_stream("s");
  std::vector<int> written(64, 0);
  std::atomic<int> observed{-1};
  s->wait(*signal, 2);
  worker(*s).enqueue([&] { observed = written[63]; });
  auto e = dev->create_event();
  e->record(*s);
  signal->raise(1);  // not far enough
  std::this_thread::sleep_for(50ms);
  CHECK_FALSE(e->query());
  CHECK(observed == -1);
  // The raising thread's writes before the raise are what the released work sees.
  std::thread raiser([&] {
    std::fill(written.begin(), written.end(), 7);
    signal->raise(2);
  });
  e->synchronize();
  raiser.join();
  CHECK(observed == 7);
  CHECK(signal->value() == 2);
  // A value already reached does not hold the stream.
  s->wait(*signal, 1);
  s->synchronize();
}

TEST_CASE("a host signal destroyed while a stream waits for it lets the stream go on") {
  auto dev = cpu();
  auto s = dev->create_stream("s");
  bool ran = false;
  {
    auto signal = dev->create_host_signal();
    s->wait(*signal, 3);
    worker(*s).enqueue([&] { ran = true; });
  }
  s->synchronize();
  CHECK(ran);
}

TEST_CASE("a stream-ordered release runs after the stream failed; other work is skipped") {
  auto dev = cpu(20);
  auto s = dev->create_stream("s");
  bool skipped_ran = false, released = false;
  worker(*s).enqueue([] { throw std::runtime_error("stream fault"); });
  worker(*s).enqueue([&] { skipped_ran = true; });
  worker(*s).enqueue_release([&] { released = true; });
  CHECK_THROWS_WITH(s->synchronize(), Catch::Contains("stream fault"));
  CHECK_FALSE(skipped_ran);
  CHECK(released);  // (a Buffer released with this stream as its order would leak otherwise)
  // And a Buffer released in stream order on the failed stream is freed, not leaked (the
  // sanitizer builds check the leak).
  Buffer b = dev->allocate(4096, MemCategory::kWorkspace, "b", MemorySpace::kDevice, s.get());
  b = Buffer();
  CHECK_THROWS(s->synchronize());
}

// DrainOnUnwind: a scope left by an exception waits for the stream's work (which may still
// write the scope's buffers) before its locals go; a scope left normally does not wait (the
// owner synchronizes where it means to). The queued work blocks until released, with a bound
// so that a guard that waited anyway fails the check instead of hanging.
TEST_CASE("DrainOnUnwind drains its stream on unwinding only") {
  auto dev = cpu();
  auto s = dev->create_stream("s");
  std::atomic<bool> ran{false};
  try {
    DrainOnUnwind drain(*s);
    worker(*s).enqueue([&] {
      std::this_thread::sleep_for(50ms);
      ran = true;
    });
    ZRT_THROW(Error, "a collective failed");
  } catch (const Error&) {
    CHECK(ran);  // drained before the scope's locals were destroyed
  }
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  ran = false;
  {
    DrainOnUnwind drain(*s);
    worker(*s).enqueue([&ran, released] {
      released.wait_for(5s);
      ran = true;
    });
  }
  CHECK_FALSE(ran);  // left normally: not drained
  release.set_value();
  s->synchronize();
  CHECK(ran);
}

// drain_each: every drain runs, also after one throws, and the first error is the one rethrown
// (ZeroEngine and CpuDevice drain their streams this way).
TEST_CASE("drain_each runs every drain and rethrows the first error") {
  std::vector<int> ran;
  CHECK_THROWS_WITH(drain_each({[&] { ran.push_back(1); },
                                [&] {
                                  ran.push_back(2);
                                  throw std::runtime_error("first");
                                },
                                [&] {
                                  ran.push_back(3);
                                  throw std::runtime_error("second");
                                },
                                [&] { ran.push_back(4); }}),
                    "first");
  CHECK(ran == std::vector<int>{1, 2, 3, 4});
  // A CPU device drains every stream, also after one failed.
  auto dev = cpu();
  auto a = dev->create_stream("a");
  auto b = dev->create_stream("b");
  std::atomic<bool> b_done{false};
  worker(*a).enqueue([] { throw std::runtime_error("stream a fault"); });
  worker(*b).enqueue([&] {
    std::this_thread::sleep_for(50ms);
    b_done = true;
  });
  CHECK_THROWS_WITH(dev->synchronize(), Catch::Contains("stream a fault"));
  CHECK(b_done);
}
