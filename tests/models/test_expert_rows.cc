// ExpertRows (models/moe/expert_rows.h): the capacity rule against hand-computed values (the
// balanced share, the granule, the reserve, the dropless worst case), and the buffers on the CPU
// backend: a first forward at the reserve, a layer beating it growing the capacity while the
// earlier layer's kept rows stay where they are, settle() bringing every buffer to the capacity
// so that the tracker's activations equal device_bytes() to the byte, the tensors of a set and
// of the scratch apart from each other and inside their buffers, and a reserve below 1 refused.
#include <catch2/catch.hpp>

#include <cstdint>
#include <memory>
#include <string>

#include "models/moe/expert_rows.h"
#include "runtime/common/error.h"
#include "runtime/device/device.h"

using namespace zrt;
using namespace zrt::moe;

namespace {

// Qwen3-30B-A3B's routing at ep 8 (128 experts, top 8: E/ep = 16 >= k) and Mixtral's at ep 4
// (8 experts, top 2: E/ep = 2), with small widths.
constexpr ExpertRowsShape kQwen3{16, 8, 8, 128, 8};
constexpr ExpertRowsShape kMixtral{16, 8, 2, 8, 4};

std::int64_t tracked_activations(Device& device) {
  return device.tracker()
      .usage(MemorySpace::kDevice)
      .current[static_cast<std::size_t>(MemCategory::kActivations)];
}

}  // namespace

TEST_CASE("the capacity rule: balanced share, granule, reserve, worst case") {
  const std::int64_t N = 1000;
  // Balanced: N x k; worst: ep x N x min(k, E/ep).
  CHECK(kQwen3.balanced_rows(N) == 8000);
  CHECK(kQwen3.worst_rows(N) == 8 * 1000 * 8);
  CHECK(kMixtral.worst_rows(N) == 4 * 1000 * 2);
  // The granule is a sixteenth of the balanced share, rounded up.
  CHECK(kQwen3.granule(N) == 500);
  CHECK(kMixtral.granule(N) == 125);
  CHECK(kMixtral.granule(1) == 1);
  // Reserve 1: the balanced share (a multiple of the granule already); 1.25: 10000; a reserve
  // between granules rounds up (1.3 x 8000 = 10400 -> 10500); past the worst case: the worst.
  CHECK(kQwen3.initial_rows(N, 1.0) == 8000);
  CHECK(kQwen3.initial_rows(N, 1.25) == 10000);
  CHECK(kQwen3.initial_rows(N, 1.3) == 10500);
  CHECK(kQwen3.initial_rows(N, 1e300) == 64000);
  CHECK(kMixtral.initial_rows(N, 4.5) == 8000);
  // Growth: the demand rounded up to the granule, never past the worst case.
  CHECK(kQwen3.grown_rows(10001, N) == 10500);
  CHECK(kQwen3.grown_rows(10500, N) == 10500);
  CHECK(kQwen3.grown_rows(63999, N) == 64000);
  CHECK(kMixtral.grown_rows(7999, N) == 8000);
  // Bytes: each tensor at the activations' 256-byte alignment; a kept set is xl (C) and gate,
  // up, h (I); the scratch staging and rows (C) and dh, dgate, dup (I).
  const std::int64_t rows = 10, element = 2;
  CHECK(kQwen3.kept_bytes(rows, element) == 512 + 3 * 256);  // 320 -> 512, 160 -> 256
  CHECK(kQwen3.scratch_bytes(rows, element) == 2 * 512 + 3 * 256);
  CHECK(kQwen3.device_bytes(3, rows, element) == 3 * 1280 + 1792);
}

TEST_CASE("buffers start at the reserve, grow with the routing and settle at the capacity") {
  std::unique_ptr<Device> device = make_device(DeviceOptions{});
  std::unique_ptr<Stream> compute = device->create_stream("compute");
  std::unique_ptr<Stream> comm = device->create_stream("comm");
  const ExpertRowsShape s{16, 8, 2, 8, 4};
  const std::int64_t N = 64;  // balanced 128 rows, granule 8, worst 512
  const std::int64_t element = 4;
  const std::int64_t before = tracked_activations(*device);
  ExpertRows rows(*device, *compute, *comm, s, 1.25);
  CHECK(rows.capacity() == 0);

  MoeKept first, second;
  first.rows_set = 0;
  second.rows_set = 1;
  MoeScratch scratch;
  // Within the reserve (1.25 x 128 = 160 rows): the first set and the scratch at 160.
  rows.fit(first, scratch, 150, N, DType::kFloat32, 0);
  CHECK(rows.capacity() == 160);
  CHECK(tracked_activations(*device) - before ==
        s.kept_bytes(160, element) + s.scratch_bytes(160, element));
  // The set's tensors follow each other inside its buffer, each with room for the capacity.
  CHECK(first.gate == first.xl + 160 * 16 * element);
  CHECK(first.up == first.gate + 160 * 8 * element);
  CHECK(first.h == first.up + 160 * 8 * element);
  CHECK(scratch.yl == scratch.staging + 160 * 16 * element);
  CHECK(scratch.dyl == scratch.yl);
  CHECK(scratch.dxl == scratch.yl);
  CHECK(scratch.dh == scratch.yl + 160 * 16 * element);
  CHECK(scratch.dgate == scratch.dh + 160 * 8 * element);
  CHECK(scratch.dup == scratch.dgate + 160 * 8 * element);
  const DevicePtr<std::byte> first_rows = first.xl;

  // The next layer receives 300 rows (2.34x): the capacity grows to 304 (a multiple of 8); its
  // set and the scratch are allocated at it, the first set keeps its 160 rows (the backward
  // reads them) until settle().
  rows.fit(second, scratch, 300, N, DType::kFloat32, 1);
  CHECK(rows.capacity() == 304);
  CHECK(first.xl == first_rows);
  CHECK(tracked_activations(*device) - before ==
        s.kept_bytes(160, element) + s.kept_bytes(304, element) + s.scratch_bytes(304, element));
  const ExpertRows::Peak peak = rows.take_peak();
  CHECK(peak.rows == 300);
  CHECK(peak.balanced == 128);
  CHECK(rows.take_peak().rows == 0);

  // After the pass: every buffer at the capacity, as zrt-mem counts it.
  rows.settle();
  CHECK(tracked_activations(*device) - before == s.device_bytes(2, 304, element));
  // A later pass within the capacity allocates nothing.
  rows.fit(first, scratch, 200, N, DType::kFloat32, 0);
  rows.fit(second, scratch, 12, N, DType::kFloat32, 1);
  rows.settle();
  CHECK(rows.capacity() == 304);
  CHECK(tracked_activations(*device) - before == s.device_bytes(2, 304, element));
  // Every rank of the group routing every token here: the worst case, and no further.
  rows.fit(first, scratch, s.worst_rows(N), N, DType::kFloat32, 0);
  CHECK(rows.capacity() == 512);
  rows.settle();
  CHECK(tracked_activations(*device) - before == s.device_bytes(2, 512, element));
}

TEST_CASE("a reserve below the balanced share is refused") {
  std::unique_ptr<Device> device = make_device(DeviceOptions{});
  std::unique_ptr<Stream> compute = device->create_stream("compute");
  std::unique_ptr<Stream> comm = device->create_stream("comm");
  try {
    ExpertRows rows(*device, *compute, *comm, ExpertRowsShape{16, 8, 2, 8, 4}, 0.5);
    FAIL("a reserve of 0.5 was accepted");
  } catch (const Error& e) {
    const std::string what = e.what();
    CHECK(what.find("model.expert_rows_reserve 0.5 is below 1") != std::string::npos);
  }
}

TEST_CASE("a routing the device cannot hold fails with the demand and the reserve named") {
  DeviceOptions options;
  options.memory_limit_bytes = 64 << 10;  // 64 KiB: the reserve fits, the worst case does not
  std::unique_ptr<Device> device = make_device(options);
  std::unique_ptr<Stream> compute = device->create_stream("compute");
  std::unique_ptr<Stream> comm = device->create_stream("comm");
  const ExpertRowsShape s{16, 8, 2, 8, 4};
  ExpertRows rows(*device, *compute, *comm, s, 1.0);
  MoeKept kept;
  MoeScratch scratch;
  rows.fit(kept, scratch, 100, 64, DType::kFloat32, 0);  // 128 rows: 2 x 12 KiB
  try {
    rows.fit(kept, scratch, 512, 64, DType::kFloat32, 3);
    FAIL("512 rows fit in 64 KiB");
  } catch (const OutOfMemory& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK(what.find("layer 3 received 512") != std::string::npos);
    CHECK(what.find("4.00x the balanced 128") != std::string::npos);
    CHECK(what.find("model.expert_rows_reserve 1") != std::string::npos);
  }
}
