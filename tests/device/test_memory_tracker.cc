// MemoryTracker accounting and the out-of-memory message; Buffer ownership on the CPU device.
#include <catch2/catch.hpp>

#include "runtime/common/error.h"
#include "runtime/device/device.h"

using namespace zrt;

TEST_CASE("tracker counts current and peak bytes per category and space") {
  MemoryTracker t;
  t.on_allocate(MemorySpace::kDevice, MemCategory::kParams, 100, "p");
  t.on_allocate(MemorySpace::kDevice, MemCategory::kGrads, 50, "g");
  t.on_allocate(MemorySpace::kPinnedHost, MemCategory::kMaster, 400, "m");
  t.on_free(MemorySpace::kDevice, MemCategory::kGrads, 50);
  t.on_allocate(MemorySpace::kDevice, MemCategory::kGrads, 20, "g2");
  const MemoryUsage d = t.usage(MemorySpace::kDevice);
  CHECK(d.current[static_cast<int>(MemCategory::kParams)] == 100);
  CHECK(d.current[static_cast<int>(MemCategory::kGrads)] == 20);
  CHECK(d.peak[static_cast<int>(MemCategory::kGrads)] == 50);
  CHECK(d.total_current == 120);
  CHECK(d.total_peak == 150);
  const MemoryUsage h = t.usage(MemorySpace::kPinnedHost);
  CHECK(h.total_current == 400);
  CHECK(h.current[static_cast<int>(MemCategory::kMaster)] == 400);
  t.reset_peaks();
  CHECK(t.usage(MemorySpace::kDevice).total_peak == 120);
}

TEST_CASE("exceeding the capacity throws OutOfMemory naming request and breakdown") {
  MemoryTracker t(1 << 20);  // 1 MiB
  t.on_allocate(MemorySpace::kDevice, MemCategory::kParams, 600 << 10, "unit 0 params");
  try {
    t.on_allocate(MemorySpace::kDevice, MemCategory::kOptimizer, 512 << 10, "adam moments");
    FAIL("expected OutOfMemory");
  } catch (const OutOfMemory& e) {
    const std::string msg = e.what();
    CHECK_THAT(msg, Catch::Contains("out of memory: 'adam moments' asked for 512.00 KiB of "
                                    "optimizer (device)"));
    CHECK_THAT(msg, Catch::Contains("only 424.00 KiB of 1.00 MiB is free"));
    CHECK_THAT(msg, Catch::Contains("params 600.00 KiB / 600.00 KiB"));
    CHECK_THAT(msg, Catch::Contains("optimizer 0 B / 0 B"));
  }
  // The failed request left no trace, and host memory is not capped.
  CHECK(t.usage(MemorySpace::kDevice).total_current == 600 << 10);
  t.on_allocate(MemorySpace::kPinnedHost, MemCategory::kMaster, 8 << 20, "host master");
  t.on_allocate(MemorySpace::kDevice, MemCategory::kGrads, 424 << 10, "exactly full");
  CHECK(t.usage(MemorySpace::kDevice).total_current == 1 << 20);
}

TEST_CASE("CPU device buffers are tracked, capped, and released on destruction") {
  DeviceOptions opts;
  opts.memory_limit_bytes = 4 << 20;
  auto dev = make_device(opts);
  CHECK(dev->type() == DeviceType::kCpu);
  {
    Buffer a = dev->allocate(3 << 20, MemCategory::kActivations, "acts");
    CHECK(dev->tracker().usage(MemorySpace::kDevice).total_current == 3 << 20);
    CHECK_THROWS_AS(dev->allocate(2 << 20, MemCategory::kParams, "too big"), OutOfMemory);
    Buffer b = std::move(a);
    CHECK(a.empty());
    CHECK(b.bytes() == 3 << 20);
    CHECK(b.count<float>() == (3 << 20) / 4);
    // Device memory cannot be dereferenced on the host; host memory can.
    CHECK_THROWS_WITH(b.host<float>(), Catch::Contains("device buffer dereferenced on the host"));
    Buffer h = dev->allocate(64, MemCategory::kMaster, "pinned", MemorySpace::kPinnedHost);
    h.host<float>()[15] = 1.0f;
    CHECK_THROWS_WITH(h.device<float>(), Catch::Contains("host buffer (host_pinned) used as "
                                                         "device memory"));
  }
  CHECK(dev->tracker().usage(MemorySpace::kDevice).total_current == 0);
  CHECK(dev->tracker().usage(MemorySpace::kDevice).total_peak == 3 << 20);
  CHECK(dev->tracker().usage(MemorySpace::kPinnedHost).total_current == 0);
}

TEST_CASE("a cuda device without CUDA support or a GPU fails with a clear error") {
  DeviceOptions opts;
  opts.type = DeviceType::kCuda;
  if (cuda_device_count() == 0) {
    CHECK_THROWS_AS(make_device(opts), Error);
  }
}

TEST_CASE("model state counts params, grads, master and optimizer only") {
  MemoryTracker t;
  t.on_allocate(MemorySpace::kDevice, MemCategory::kParams, 10, "p");
  t.on_allocate(MemorySpace::kDevice, MemCategory::kActivations, 1000, "a");
  t.on_allocate(MemorySpace::kDevice, MemCategory::kOptimizer, 20, "o");
  t.on_free(MemorySpace::kDevice, MemCategory::kParams, 10);
  t.on_allocate(MemorySpace::kDevice, MemCategory::kGrads, 5, "g");
  t.on_allocate(MemorySpace::kDevice, MemCategory::kComm, 7, "c");
  const MemoryUsage u = t.usage(MemorySpace::kDevice);
  CHECK(u.model_state_current == 25);
  CHECK(u.model_state_peak == 30);
  CHECK(u.total_peak == 1032);  // 10 + 1000 + 20 - 10 + 5 + 7
}
