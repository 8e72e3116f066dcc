// The CUDA backend's device, streams and events against the seam contracts that
// test_streams.cc and test_memory_tracker.cc check on the CPU backend: tracked allocations and
// out-of-memory errors, stream-ordered copies and releases, CUDA event semantics, host
// callbacks and their sticky errors. Skipped (exit 77) where no GPU is usable.
#include <catch2/catch.hpp>

#include <algorithm>
#include <utility>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>

#include "runtime/common/error.h"
#include "runtime/device/cuda_device.h"
#include "runtime/device/device.h"
#include "runtime/device/device_access.h"
#include "runtime/device/host_memory.h"
#include "tests/support/gpu_test_support.h"

using namespace zrt;
using namespace std::chrono_literals;

namespace {

std::unique_ptr<Device> gpu(std::int64_t memory_limit_bytes = 0) {
  DeviceOptions o;
  o.type = DeviceType::kCuda;
  o.index = test::gpu_index();
  o.memory_limit_bytes = memory_limit_bytes;
  return make_device(o);
}

std::int64_t in_use(const Device& dev, MemorySpace space, MemCategory category) {
  return dev.tracker().usage(space).current[static_cast<std::size_t>(category)];
}

template <typename T>
std::uintptr_t address(DevicePtr<T> p) {
  return reinterpret_cast<std::uintptr_t>(device_access::raw(p));
}

std::vector<float> iota_floats(std::size_t n, float scale) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i) * scale;
  return v;
}

}  // namespace

TEST_CASE("the CUDA device describes itself and is counted") {
  CHECK(cuda_device_count() >= 1);
  auto dev = gpu();
  CHECK(dev->type() == DeviceType::kCuda);
  CHECK_THAT(dev->description(), Catch::StartsWith("cuda:"));
  CHECK(dev->tracker().capacity() > 0);  // the GPU's memory when no limit is given
  auto limited = gpu(std::int64_t{1} << 30);
  CHECK_THAT(limited->description(), Catch::Contains("capacity 1.00 GiB"));

  DeviceOptions bad;
  bad.type = DeviceType::kCuda;
  bad.index = cuda_device_count();
  CHECK_THROWS_AS(make_device(bad), InvalidArgument);
}

TEST_CASE("allocations are tracked per space and category, aligned, and released") {
  auto dev = gpu();
  {
    Buffer params = dev->allocate(1 << 20, MemCategory::kParams, "params");
    Buffer pinned =
        dev->allocate(4096, MemCategory::kOptimizer, "pinned moments", MemorySpace::kPinnedHost);
    Buffer pageable =
        dev->allocate(100, MemCategory::kOther, "pageable", MemorySpace::kPageableHost);
    Buffer empty = dev->allocate(0, MemCategory::kWorkspace, "empty");
    CHECK(in_use(*dev, MemorySpace::kDevice, MemCategory::kParams) == (1 << 20));
    CHECK(in_use(*dev, MemorySpace::kPinnedHost, MemCategory::kOptimizer) == 4096);
    CHECK(in_use(*dev, MemorySpace::kPageableHost, MemCategory::kOther) == 100);
    CHECK(address(params.device<std::byte>()) % 256 == 0);
    CHECK(reinterpret_cast<std::uintptr_t>(pinned.host<std::byte>()) % 256 == 0);
    CHECK(reinterpret_cast<std::uintptr_t>(pageable.host<std::byte>()) % 256 == 0);
    // Host memory is host-addressable; device memory is not.
    pinned.host<float>()[0] = 1.5f;
    pageable.host<char>()[99] = 'x';
    CHECK_THROWS_WITH(params.host<float>(), Catch::Contains("device buffer dereferenced"));
    CHECK_THROWS_WITH(pinned.device<float>(), Catch::Contains("used as device memory"));
    params.reset();
    CHECK(in_use(*dev, MemorySpace::kDevice, MemCategory::kParams) == 0);
  }
  for (MemorySpace space :
       {MemorySpace::kDevice, MemorySpace::kPinnedHost, MemorySpace::kPageableHost}) {
    CHECK(dev->tracker().usage(space).total_current == 0);
  }
  CHECK(dev->tracker().usage(MemorySpace::kDevice).total_peak >= (1 << 20));
}

TEST_CASE("a capacity limit throws OutOfMemory before allocating") {
  auto dev = gpu(1 << 20);
  Buffer half = dev->allocate(512 << 10, MemCategory::kGrads, "grad bucket 0");
  CHECK_THROWS_AS(dev->allocate(768 << 10, MemCategory::kGrads, "grad bucket 1"), OutOfMemory);
  CHECK_THROWS_WITH(dev->allocate(768 << 10, MemCategory::kGrads, "grad bucket 1"),
                    Catch::Contains("grad bucket 1") && Catch::Contains("grads"));
  CHECK(dev->tracker().usage(MemorySpace::kDevice).total_current == (512 << 10));
}

TEST_CASE("a failed cudaMallocAsync becomes OutOfMemory and leaves the tracker unchanged") {
  auto dev = gpu(std::int64_t{1} << 52);  // a capacity far beyond the GPU: the driver says no
  auto s = dev->create_stream("s");
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  ZRT_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  const auto huge = static_cast<std::int64_t>(2 * total_bytes);
  CHECK_THROWS_WITH(dev->allocate(huge, MemCategory::kActivations, "too big"),
                    Catch::Contains("cudaMallocAsync failed") && Catch::Contains("too big"));
  CHECK_THROWS_AS(dev->allocate(huge, MemCategory::kActivations, "too big, ordered",
                                MemorySpace::kDevice, s.get()),
                  OutOfMemory);
  CHECK(dev->tracker().usage(MemorySpace::kDevice).total_current == 0);
  // The device is still usable afterwards.
  Buffer ok = dev->allocate(4096, MemCategory::kActivations, "fine");
  dev->fill_zero(ok.device<std::byte>(), 4096, *s);
  s->synchronize();
}

TEST_CASE("copies round-trip through device memory in stream order") {
  auto dev = gpu();
  auto s = dev->create_stream("copy");
  const std::size_t n = 1 << 20;
  const std::size_t bytes = n * sizeof(float);
  Buffer staging = dev->allocate(static_cast<std::int64_t>(bytes), MemCategory::kWorkspace,
                                 "staging", MemorySpace::kPinnedHost);
  const auto src = iota_floats(n, 0.25f);
  std::copy(src.begin(), src.end(), staging.host<float>());
  Buffer d1 = dev->allocate(static_cast<std::int64_t>(bytes), MemCategory::kParams, "d1");
  Buffer d2 = dev->allocate(static_cast<std::int64_t>(bytes), MemCategory::kParams, "d2");
  dev->copy_to_device(d1.device<std::byte>(), staging.host<std::byte>(), bytes, *s);
  dev->copy(d2.device<std::byte>(), d1.device<std::byte>(), bytes, *s);
  dev->fill_zero(d1.device<std::byte>(), bytes, *s);
  std::vector<float> back(n, -1.0f);  // pageable destination
  dev->copy_to_host(back.data(), d2.device<std::byte>(), bytes, *s);
  s->synchronize();
  CHECK(back == src);
  dev->copy_to_host(staging.host<std::byte>(), d1.device<std::byte>(), bytes, *s);
  dev->synchronize();
  CHECK(std::vector<float>(staging.host<float>(), staging.host<float>() + n) ==
        std::vector<float>(n, 0.0f));
  // Zero-byte operations are no-ops.
  dev->copy(d2.device<std::byte>(), d1.device<std::byte>(), 0, *s);
  dev->fill_zero(d2.device<std::byte>(), 0, *s);
  s->synchronize();
}

TEST_CASE("poison_allocations: device, pinned and pageable memory start as 0xFF bytes") {
  DeviceOptions o;
  o.type = DeviceType::kCuda;
  o.index = test::gpu_index();
  o.poison_allocations = true;
  auto dev = make_device(o);
  auto s = dev->create_stream("poisoned");
  const auto all_ff = [](const std::vector<unsigned char>& bytes) {
    return std::all_of(bytes.begin(), bytes.end(), [](unsigned char c) { return c == 0xFF; });
  };
  const std::size_t bytes = 3000;
  // In the allocating stream's order, and without one (usable on every stream at once).
  for (Stream* order : {static_cast<Stream*>(s.get()), static_cast<Stream*>(nullptr)}) {
    Buffer device_buffer = dev->allocate(static_cast<std::int64_t>(bytes), MemCategory::kParams,
                                         "poisoned device", MemorySpace::kDevice, order);
    std::vector<unsigned char> back(bytes, 0);
    dev->copy_to_host(back.data(), device_buffer.device<std::byte>(), bytes, *s);
    s->synchronize();
    CHECK(all_ff(back));
  }
  // Host memory: small pinned (cudaHostAlloc), large pinned (resident pages), pageable.
  const std::size_t large = kResidentHostMinBytes + 1000;
  for (const auto& [space, n] :
       {std::pair{MemorySpace::kPinnedHost, bytes}, std::pair{MemorySpace::kPinnedHost, large},
        std::pair{MemorySpace::kPageableHost, bytes}}) {
    Buffer host = dev->allocate(static_cast<std::int64_t>(n), MemCategory::kWorkspace,
                                "poisoned host", space);
    const auto* p = host.host<unsigned char>();
    CHECK(all_ff(std::vector<unsigned char>(p, p + n)));
  }
}

// Pinned buffers of kResidentHostMinBytes and more are resident pages page-locked with
// cudaHostRegister (host_memory.h) where the GPU reaches them at their host address; the
// stand-in checks them as pinned memory until cudaHostUnregister. Run again with
// ZRT_STANDIN_HOST_REGISTER=0 (test_cuda_device_no_host_register): cudaHostAlloc's path.
TEST_CASE("large pinned buffers round-trip and are released in stream order", "[pinned]") {
  auto dev = gpu();
  auto s = dev->create_stream("copy");
  const std::size_t n = kResidentHostMinBytes / sizeof(float) + 3;
  const std::size_t bytes = n * sizeof(float);
  Buffer up = dev->allocate(static_cast<std::int64_t>(bytes), MemCategory::kMaster, "master",
                            MemorySpace::kPinnedHost, s.get());
  Buffer down = dev->allocate(static_cast<std::int64_t>(bytes), MemCategory::kOptimizer, "moments",
                              MemorySpace::kPinnedHost);
  CHECK(in_use(*dev, MemorySpace::kPinnedHost, MemCategory::kMaster) ==
        static_cast<std::int64_t>(bytes));
  const auto src = iota_floats(n, 0.5f);
  std::copy(src.begin(), src.end(), up.host<float>());
  Buffer d = dev->allocate(static_cast<std::int64_t>(bytes), MemCategory::kParams, "d");
  s->host_callback([] { std::this_thread::sleep_for(20ms); });  // the copy is still pending...
  dev->copy_to_device(d.device<std::byte>(), up.host<std::byte>(), bytes, *s);
  up.reset();  // ...when the release is asked for: it waits for the copy
  dev->copy_to_host(down.host<std::byte>(), d.device<std::byte>(), bytes, *s);
  s->synchronize();
  CHECK(std::equal(src.begin(), src.end(), down.host<float>()));
  down.reset();
  dev->synchronize();
  CHECK(dev->tracker().usage(MemorySpace::kPinnedHost).total_current == 0);
}

TEST_CASE("stream-ordered allocation and release follow the work already enqueued") {
  auto dev = gpu();
  auto s = dev->create_stream("s");
  const std::size_t n = 1 << 16;
  const auto ones = std::vector<float>(n, 1.0f);
  std::vector<float> out(n, 0.0f);
  {
    Buffer b = dev->allocate(static_cast<std::int64_t>(n * 4), MemCategory::kWorkspace, "ordered",
                             MemorySpace::kDevice, s.get());
    s->host_callback([] { std::this_thread::sleep_for(20ms); });
    dev->copy_to_device(b.device<std::byte>(), ones.data(), n * 4, *s);
    dev->copy_to_host(out.data(), b.device<std::byte>(), n * 4, *s);
  }  // cudaFreeAsync on s: after the copies
  CHECK(dev->tracker().usage(MemorySpace::kDevice).total_current == 0);
  // Pinned memory released with an ordering stream is freed once the stream passes that point.
  {
    Buffer pinned = dev->allocate(static_cast<std::int64_t>(n * 4), MemCategory::kWorkspace,
                                  "pinned ordered", MemorySpace::kPinnedHost, s.get());
    std::fill(pinned.host<float>(), pinned.host<float>() + n, 2.0f);
    Buffer d = dev->allocate(static_cast<std::int64_t>(n * 4), MemCategory::kWorkspace, "d");
    dev->copy_to_device(d.device<std::byte>(), pinned.host<std::byte>(), n * 4, *s);
    pinned.reset();  // deferred until the copy is done
    dev->copy_to_host(out.data(), d.device<std::byte>(), n * 4, *s);
    s->synchronize();
    CHECK(out == std::vector<float>(n, 2.0f));
  }
  s->synchronize();
  dev->synchronize();  // also frees the deferred host memory
}

TEST_CASE("an event orders work across CUDA streams") {
  auto dev = gpu();
  auto a = dev->create_stream("a");
  auto b = dev->create_stream("b");
  auto e = dev->create_event();
  const std::size_t n = 1 << 20;
  const auto src = iota_floats(n, 1.0f);
  Buffer x = dev->allocate(static_cast<std::int64_t>(n * 4), MemCategory::kWorkspace, "x");
  Buffer y = dev->allocate(static_cast<std::int64_t>(n * 4), MemCategory::kWorkspace, "y");
  dev->fill_zero(y.device<std::byte>(), n * 4, *b);
  b->synchronize();
  // Stream a is held back by a slow callback, so without the wait b would read zeros.
  a->host_callback([] { std::this_thread::sleep_for(100ms); });
  dev->copy_to_device(x.device<std::byte>(), src.data(), n * 4, *a);
  dev->copy(y.device<std::byte>(), x.device<std::byte>(), n * 4, *a);
  e->record(*a);
  b->wait(*e);
  std::vector<float> out(n, -1.0f);
  dev->copy_to_host(out.data(), y.device<std::byte>(), n * 4, *b);
  b->synchronize();
  CHECK(out == src);
  CHECK(e->query());
}

TEST_CASE("a CUDA event whose host waits sleep orders streams and the host like any other") {
  auto dev = gpu();
  auto a = dev->create_stream("a");
  auto b = dev->create_stream("b");
  auto e = dev->create_event(EventWait::kBlock);
  const std::size_t n = 1 << 16;
  const auto src = iota_floats(n, 3.0f);
  Buffer x = dev->allocate(static_cast<std::int64_t>(n * 4), MemCategory::kWorkspace, "x");
  // Pinned, so that the copy down is asynchronous (to pageable memory the call itself waits).
  Buffer pinned = dev->allocate(static_cast<std::int64_t>(n * 4), MemCategory::kWorkspace, "pinned",
                                MemorySpace::kPinnedHost);
  float* host = pinned.host<float>();
  std::fill(host, host + n, -1.0f);
  // The host's wait must not return before the slow stream's copy down has landed.
  a->host_callback([] { std::this_thread::sleep_for(100ms); });
  dev->copy_to_device(x.device<std::byte>(), src.data(), n * 4, *a);
  dev->copy_to_host(host, x.device<std::byte>(), n * 4, *a);
  e->record(*a);
  CHECK_FALSE(e->query());
  e->synchronize();
  CHECK(std::equal(src.begin(), src.end(), host));
  // And a stream's wait on it orders that stream after the record.
  std::vector<float> again(n, -1.0f);
  a->host_callback([] { std::this_thread::sleep_for(50ms); });
  e->record(*a);
  b->wait(*e);
  dev->copy_to_host(again.data(), x.device<std::byte>(), n * 4, *b);
  b->synchronize();
  CHECK(e->query());
  CHECK(again == src);
}

TEST_CASE("a CUDA wait binds to the record that was latest when the wait was issued") {
  auto dev = gpu();
  auto a = dev->create_stream("a");
  auto b = dev->create_stream("b");
  auto e = dev->create_event();
  std::promise<void> release;
  auto released = release.get_future().share();
  a->host_callback([] {});
  e->record(*a);  // record 1: completes at once
  b->wait(*e);    // binds to record 1
  a->host_callback([released] { released.wait_for(30s); });
  e->record(*a);  // record 2: blocked until release
  // b's own work is device work, not a callback: CUDA may run all host callbacks on one thread,
  // which the blocked callback on a holds.
  Buffer scratch = dev->allocate(1 << 20, MemCategory::kWorkspace, "scratch");
  dev->fill_zero(scratch.device<std::byte>(), 1 << 20, *b);
  auto done = std::async(std::launch::async, [&] { b->synchronize(); });
  const bool finished = done.wait_for(10s) == std::future_status::ready;
  CHECK_FALSE(e->query());  // query reflects the latest record
  release.set_value();
  CHECK(finished);
  e->synchronize();
  CHECK(e->query());
  done.get();
}

TEST_CASE("a never-recorded CUDA event is complete and waiting on it is a no-op") {
  auto dev = gpu();
  auto s = dev->create_stream("s");
  auto e = dev->create_event();
  CHECK(e->query());
  e->synchronize();
  s->wait(*e);
  bool ran = false;
  s->host_callback([&] { ran = true; });
  s->synchronize();
  CHECK(ran);
}

TEST_CASE("re-recording an event moves it to the new record") {
  auto dev = gpu();
  auto a = dev->create_stream("a");
  auto c = dev->create_stream("c");
  auto e = dev->create_event();
  std::promise<void> release;
  auto released = release.get_future().share();
  a->host_callback([released] { released.wait_for(30s); });
  e->record(*a);
  CHECK_FALSE(e->query());
  e->record(*c);  // c is idle: the new record completes at once
  c->synchronize();
  CHECK(e->query());
  e->synchronize();
  release.set_value();
  a->synchronize();
}

TEST_CASE("host callbacks run in stream order and may not call the stream API") {
  auto dev = gpu();
  auto s = dev->create_stream("s");
  std::vector<int> order;
  for (int i = 0; i < 50; ++i) s->host_callback([&order, i] { order.push_back(i); });
  s->synchronize();
  REQUIRE(order.size() == 50);
  for (int i = 0; i < 50; ++i) CHECK(order[i] == i);

  auto other = dev->create_stream("other");
  auto e = dev->create_event();
  s->host_callback([&] { e->record(*other); });
  CHECK_THROWS_WITH(s->synchronize(), Catch::Contains("Event::record called from a host callback"));
}

TEST_CASE("an error in a host callback is sticky and reported through later events") {
  auto dev = gpu();
  auto s = dev->create_stream("s");
  auto before = dev->create_event();
  auto after = dev->create_event();
  bool later_ran = false;
  before->record(*s);
  s->host_callback([] { ZRT_THROW(Error, "simulated callback failure"); });
  s->host_callback([&] { later_ran = true; });
  after->record(*s);
  CHECK_THROWS_WITH(after->synchronize(), Catch::Contains("simulated callback failure"));
  CHECK_NOTHROW(before->synchronize());  // recorded before the failure
  CHECK_THROWS_WITH(s->synchronize(), Catch::Contains("simulated callback failure"));
  CHECK_THROWS_WITH(dev->synchronize(), Catch::Contains("simulated callback failure"));
  CHECK_FALSE(later_ran);
}

TEST_CASE("cuda_stream_handle unwraps CUDA streams only") {
  auto dev = gpu();
  auto s = dev->create_stream("cuda");
  CHECK(cuda_stream_handle(*s) != nullptr);
  auto cpu = make_device(DeviceOptions{});
  auto cpu_stream = cpu->create_stream("cpu");
  CHECK_THROWS_WITH(cuda_stream_handle(*cpu_stream), Catch::Contains("is not a CUDA stream"));
  Buffer b = dev->allocate(64, MemCategory::kOther, "b");
  CHECK_THROWS_WITH(dev->fill_zero(b.device<std::byte>(), 64, *cpu_stream),
                    Catch::Contains("is not a CUDA stream"));
  auto cpu_event = cpu->create_event();
  CHECK_THROWS_WITH(s->wait(*cpu_event), Catch::Contains("another backend"));
}

TEST_CASE("Device::synchronize waits for every stream") {
  auto dev = gpu();
  std::vector<std::unique_ptr<Stream>> streams;
  std::atomic<int> finished{0};
  for (int i = 0; i < 4; ++i) {
    streams.push_back(dev->create_stream("s" + std::to_string(i)));
    streams.back()->host_callback([&] {
      std::this_thread::sleep_for(20ms);
      ++finished;
    });
  }
  dev->synchronize();
  CHECK(finished == 4);
}

TEST_CASE("a host signal holds a CUDA stream's copies until a host thread raises it") {
  auto dev = gpu();
  auto s = dev->create_stream("s");
  auto signal = dev->create_host_signal();
  CHECK(signal->value() == 0);
  const std::size_t n = 1 << 16;
  const auto src = iota_floats(n, 2.0f);
  Buffer x = dev->allocate(static_cast<std::int64_t>(n * 4), MemCategory::kWorkspace, "x");
  Buffer staging = dev->allocate(static_cast<std::int64_t>(n * 4), MemCategory::kWorkspace,
                                 "staging", MemorySpace::kPinnedHost);
  Buffer back = dev->allocate(static_cast<std::int64_t>(n * 4), MemCategory::kWorkspace, "back",
                              MemorySpace::kPinnedHost);
  float* up = staging.host<float>();
  float* down = back.host<float>();
  std::fill(up, up + n, -1.0f);
  std::fill(down, down + n, -2.0f);
  // The copy up reads `staging` only once the host has written it and raised the signal to 2.
  s->wait(*signal, 2);
  dev->copy_to_device(x.device<std::byte>(), up, n * 4, *s);
  dev->copy_to_host(down, x.device<std::byte>(), n * 4, *s);
  auto e = dev->create_event();
  e->record(*s);
  signal->raise(1);  // not far enough
  std::this_thread::sleep_for(100ms);
  CHECK_FALSE(e->query());
  CHECK(down[0] == -2.0f);
  std::thread raiser([&] {
    std::copy(src.begin(), src.end(), up);
    signal->raise(2);
  });
  e->synchronize();
  raiser.join();
  CHECK(std::equal(src.begin(), src.end(), down));
  CHECK(signal->value() == 2);
  // A value already reached does not hold the stream; a signal destroyed while a stream waits
  // for it lets the stream go on.
  s->wait(*signal, 1);
  {
    auto gone = dev->create_host_signal();
    s->wait(*gone, 9);
  }
  s->synchronize();
}
