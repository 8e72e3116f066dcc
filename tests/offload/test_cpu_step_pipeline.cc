// The offload's CPU step as one stream of chunks (offload/cpu_step_pipeline.h): the same bits as
// the optimizer's own step unit by unit, the waits it owes the copy stream (a gradient piece
// landing, a staging buffer going free while the previous unit's completion is what frees it),
// and errors reaching every unit not yet done.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "offload/cpu_step_pipeline.h"
#include "optimizers/optimizer.h"
#include "runtime/common/dtype.h"
#include "runtime/device/device.h"

namespace zrt {
namespace {

// One unit's host arrays: fp32 master and two states, bf16 gradient and bf16 output.
struct UnitArrays {
  std::vector<float> master, m, v;
  std::vector<bf16> grad, out;
};

std::vector<UnitArrays> make_units(const std::vector<std::int64_t>& sizes, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<UnitArrays> units(sizes.size());
  for (std::size_t u = 0; u < sizes.size(); ++u) {
    const auto n = static_cast<std::size_t>(sizes[u]);
    UnitArrays& a = units[u];
    a.master.resize(n);
    a.m.resize(n);
    a.v.resize(n);
    a.grad.resize(n);
    a.out.assign(n, to_bf16(-7.0f));
    for (std::size_t i = 0; i < n; ++i) {
      a.master[i] = normal(rng);
      a.m[i] = 0.1f * normal(rng);
      a.v[i] = 0.01f * std::abs(normal(rng));
      a.grad[i] = to_bf16(normal(rng));
    }
  }
  return units;
}

// Elements [begin, end) of the unit as one slice.
OptimizerSlice slice_of(UnitArrays& a, std::int64_t begin, std::int64_t end, bool weight_decay) {
  OptimizerSlice s;
  s.param = a.master.data() + begin;
  s.state[0] = a.m.data() + begin;
  s.state[1] = a.v.data() + begin;
  s.grad = a.grad.data() + begin;
  s.grad_dtype = DType::kBFloat16;
  s.param_out = a.out.data() + begin;
  s.out_dtype = DType::kBFloat16;
  s.numel = end - begin;
  s.weight_decay = weight_decay;
  return s;
}

// The unit's elements as slices of at most `piece` elements (as the offload cuts them where the
// gradient's pieces land), alternating weight decay.
std::vector<OptimizerSlice> slices_of(UnitArrays& a, std::int64_t piece) {
  std::vector<OptimizerSlice> slices;
  const auto n = static_cast<std::int64_t>(a.master.size());
  for (std::int64_t begin = 0; begin < n; begin += piece) {
    slices.push_back(slice_of(a, begin, std::min(n, begin + piece), (begin / piece) % 2 == 0));
  }
  return slices;
}

void check_same(const std::vector<UnitArrays>& a, const std::vector<UnitArrays>& b) {
  REQUIRE(a.size() == b.size());
  for (std::size_t u = 0; u < a.size(); ++u) {
    INFO("unit " << u);
    const std::size_t n = a[u].master.size();
    CHECK(std::memcmp(a[u].master.data(), b[u].master.data(), n * sizeof(float)) == 0);
    CHECK(std::memcmp(a[u].m.data(), b[u].m.data(), n * sizeof(float)) == 0);
    CHECK(std::memcmp(a[u].v.data(), b[u].v.data(), n * sizeof(float)) == 0);
    CHECK(std::memcmp(a[u].out.data(), b[u].out.data(), n * sizeof(bf16)) == 0);
  }
}

std::unique_ptr<HostOptimizer> adamw(int threads) {
  AdamOptions o;
  o.lr = 3e-3;
  o.weight_decay = 0.1;
  CpuAdamOptions cpu;
  cpu.num_threads = threads;
  return make_host_adam(o, cpu);
}

// "adamw" or "lion" on `threads` threads.
std::unique_ptr<HostOptimizer> host_optimizer(const std::string& kind, int threads) {
  if (kind != "lion") return adamw(threads);
  LionOptions o;
  o.lr = 1e-3;
  o.weight_decay = 0.2;
  CpuAdamOptions cpu;
  cpu.num_threads = threads;
  return make_host_lion(o, cpu);
}

// Units past one chunk (1 << 16), a one-element unit, an empty one, pieces that cut mid-chunk.
const std::vector<std::int64_t> kSizes = {200003, 65536, 1, 0, 131073, 5000};
constexpr std::int64_t kPiece = 70001;
constexpr std::int64_t kStep = 3;
constexpr double kLr = 2e-3;
constexpr double kScale = 0.75;

}  // namespace

TEST_CASE("cpu_step_chunks: whole chunks from the first aligned element, covering every element") {
  alignas(256) static float data[1024];
  for (int offset : {0, 1, 3, 63, 64}) {
    INFO("offset " << offset);
    const float* param = data + offset;
    const auto ranges = cpu_step_chunks(param, 900, 128, 256);
    REQUIRE(!ranges.empty());
    CHECK(ranges.front().begin == 0);
    CHECK(ranges.back().end == 900);
    // The head runs to the first 256-byte boundary (64 floats), the rest are 128 long (512
    // bytes), so every chunk after the head starts on a boundary.
    const std::int64_t head = (64 - offset % 64) % 64;
    for (std::size_t k = 0; k < ranges.size(); ++k) {
      if (k > 0) CHECK(ranges[k].begin == ranges[k - 1].end);
      if (k > 0) CHECK(reinterpret_cast<std::uintptr_t>(param + ranges[k].begin) % 256 == 0);
      if (k > 0 && k + 1 < ranges.size()) CHECK(ranges[k].end - ranges[k].begin == 128);
    }
    CHECK(ranges.front().end == (head > 0 ? head : 128));
  }
  CHECK(cpu_step_chunks(data, 0, 128, 256).empty());
  CHECK(cpu_step_chunks(data, 5, 128, 256).size() == 1);
}

TEST_CASE("CPU step pipeline: the bits of the optimizer's own step, unit by unit, any team size") {
  for (const char* kind : {"adamw", "lion"}) {
    for (int threads : {1, 3, 8}) {
      INFO(kind << ", " << threads << " threads");
      std::unique_ptr<HostOptimizer> optimizer = host_optimizer(kind, threads);
      auto reference = make_units(kSizes, 7);
      auto piped = make_units(kSizes, 7);
      for (auto& unit : reference) optimizer->step(slices_of(unit, kPiece), kStep, kLr, kScale);

      std::vector<CpuStepUnit> work(piped.size());
      std::vector<int> after_calls(piped.size(), 0);
      std::vector<std::atomic<int>> released(piped.size());
      for (std::size_t u = 0; u < piped.size(); ++u) {
        work[u].slices = slices_of(piped[u], kPiece);
        work[u].done = std::make_shared<std::promise<void>>();
        work[u].after = [&after_calls, u] { ++after_calls[u]; };
        released[u] = 0;
        work[u].released = [&released, u] { ++released[u]; };
        work[u].trace_name = "unit " + std::to_string(u);
      }
      run_cpu_step_pipeline(work, optimizer->prepare_step(kStep, kLr, kScale), optimizer->threads(),
                            nullptr);
      for (std::size_t u = 0; u < work.size(); ++u) {
        CHECK(after_calls[u] == 1);
        CHECK(released[u] == 1);
        auto done = work[u].done->get_future();
        CHECK(done.wait_for(std::chrono::seconds(0)) == std::future_status::ready);
      }
      check_same(reference, piped);
    }
  }
}

TEST_CASE("the split step: the compute-dtype copy first, then the state, the bits of one step") {
  for (const char* kind : {"adamw", "lion"}) {
    for (int threads : {1, 3}) {
      INFO(kind << ", " << threads << " threads");
      std::unique_ptr<HostOptimizer> optimizer = host_optimizer(kind, threads);
      auto reference = make_units(kSizes, 11);
      auto split = make_units(kSizes, 11);
      const auto before = split;
      for (auto& unit : reference) optimizer->step(slices_of(unit, kPiece), kStep, kLr, kScale);

      std::vector<CpuStepUnit> copies(split.size()), states(split.size());
      for (std::size_t u = 0; u < split.size(); ++u) {
        copies[u].slices = slices_of(split[u], kPiece);
        copies[u].done = std::make_shared<std::promise<void>>();
        states[u].slices = slices_of(split[u], kPiece);
        for (OptimizerSlice& slice : states[u].slices) slice.param_out = nullptr;
        states[u].done = std::make_shared<std::promise<void>>();
      }
      run_cpu_step_pipeline(
          copies, optimizer->prepare_step(kStep, kLr, kScale, StepWrites::kComputeCopyOnly),
          optimizer->threads(), nullptr);
      // The copy is the step's; the parameters and states are untouched.
      for (std::size_t u = 0; u < split.size(); ++u) {
        INFO("unit " << u);
        const std::size_t n = split[u].master.size();
        CHECK(std::memcmp(split[u].out.data(), reference[u].out.data(), n * sizeof(bf16)) == 0);
        CHECK(std::memcmp(split[u].master.data(), before[u].master.data(), n * sizeof(float)) == 0);
        CHECK(std::memcmp(split[u].m.data(), before[u].m.data(), n * sizeof(float)) == 0);
        CHECK(std::memcmp(split[u].v.data(), before[u].v.data(), n * sizeof(float)) == 0);
      }
      run_cpu_step_pipeline(states, optimizer->prepare_step(kStep, kLr, kScale),
                            optimizer->threads(), nullptr);
      check_same(reference, split);
    }
  }
}

TEST_CASE(
    "CPU step pipeline: a piece is read only after it lands, a unit written only once its "
    "staging buffer is free") {
  auto device = make_device(DeviceOptions{});
  auto optimizer = adamw(4);
  auto reference = make_units(kSizes, 11);
  auto piped = make_units(kSizes, 11);
  // The gradients the CPU must read are the ones the "copy stream" writes late.
  const auto late = make_units(kSizes, 12);
  for (std::size_t u = 0; u < reference.size(); ++u) reference[u].grad = late[u].grad;
  for (auto& unit : reference) optimizer->step(slices_of(unit, kPiece), kStep, kLr, kScale);

  std::unique_ptr<Stream> copy = device->create_stream("copy");
  std::vector<std::unique_ptr<Event>> events;
  std::vector<CpuStepUnit> work(piped.size());
  for (std::size_t u = 0; u < piped.size(); ++u) {
    work[u].slices = slices_of(piped[u], kPiece);
    work[u].done = std::make_shared<std::promise<void>>();
  }
  // Each piece lands after a delay, in order, as the copy stream brings it.
  for (std::size_t u = 0; u < piped.size(); ++u) {
    for (std::size_t k = 0; k < work[u].slices.size(); ++k) {
      const std::int64_t begin = static_cast<std::int64_t>(k) * kPiece;
      const std::int64_t count = work[u].slices[k].numel;
      bf16* to = piped[u].grad.data() + begin;
      const bf16* from = late[u].grad.data() + begin;
      copy->host_callback([to, from, count] {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        std::memcpy(to, from, static_cast<std::size_t>(count) * sizeof(bf16));
      });
      events.push_back(device->create_event());
      events.back()->record(*copy);
      work[u].landed.push_back(events.back().get());
    }
  }
  // Unit 4 writes its output where unit 0's went ("staging slot"): the slot is free once unit
  // 0's output has been read, after unit 0 is done. The reader overwrites the slot's contents
  // with a sentinel after reading, so an early write by unit 4 would be lost.
  std::unique_ptr<Stream> up = device->create_stream("up");
  std::vector<bf16> slot0_copy;
  std::shared_future<void> unit0_done = work[0].done->get_future().share();
  bf16* unit4_out = piped[4].out.data();
  const std::size_t unit4_n = piped[4].out.size();
  const bf16* unit0_out = piped[0].out.data();
  const std::size_t unit0_n = piped[0].out.size();
  up->host_callback([&slot0_copy, unit0_done, unit0_out, unit0_n, unit4_out, unit4_n] {
    unit0_done.get();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    slot0_copy.assign(unit0_out, unit0_out + unit0_n);
    for (std::size_t i = 0; i < unit4_n; ++i) unit4_out[i] = to_bf16(-99.0f);
  });
  std::unique_ptr<Event> slot_free = device->create_event();
  slot_free->record(*up);
  work[4].slot_free = slot_free.get();

  run_cpu_step_pipeline(work, optimizer->prepare_step(kStep, kLr, kScale), optimizer->threads(),
                        nullptr);
  up->synchronize();
  check_same(reference, piped);
  CHECK(std::memcmp(slot0_copy.data(), reference[0].out.data(), unit0_n * sizeof(bf16)) == 0);
}

TEST_CASE(
    "CPU step pipeline: a unit's padding is zeroed once its buffer is free and before its "
    "release, a unit of padding alone too") {
  auto device = make_device(DeviceOptions{});
  auto optimizer = adamw(2);
  // Unit 0 owns elements [0, 100) and [128, 200) of its 256-element buffer; unit 1 owns none of
  // its 64 (a rank's slice past a unit's last parameter). Both buffers hold stale bytes, as a
  // staging buffer does after carrying another unit up.
  auto arrays = make_units({256}, 21);
  auto reference = make_units({256}, 21);
  std::vector<OptimizerSlice> owned = {slice_of(arrays[0], 0, 100, true),
                                       slice_of(arrays[0], 128, 200, false)};
  optimizer->step({slice_of(reference[0], 0, 100, true), slice_of(reference[0], 128, 200, false)},
                  kStep, kLr, kScale);
  std::vector<bf16> alone(64, to_bf16(-5.0f));
  std::vector<CpuStepUnit> work(2);
  work[0].slices = owned;
  const auto bytes = [](std::int64_t n) { return static_cast<std::size_t>(n) * sizeof(bf16); };
  work[0].padding = {{reinterpret_cast<std::byte*>(arrays[0].out.data() + 100), bytes(28)},
                     {reinterpret_cast<std::byte*>(arrays[0].out.data() + 200), bytes(56)}};
  work[1].padding = {{reinterpret_cast<std::byte*>(alone.data()), bytes(64)}};
  // Unit 1's buffer is free only once the "copy stream" has read it; the reader leaves a
  // sentinel behind, so zeros written before the wait would be overwritten.
  std::unique_ptr<Stream> up = device->create_stream("up");
  bf16* alone_data = alone.data();
  up->host_callback([alone_data] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    for (int i = 0; i < 64; ++i) alone_data[i] = to_bf16(-99.0f);
  });
  std::unique_ptr<Event> slot_free = device->create_event();
  slot_free->record(*up);
  work[1].slot_free = slot_free.get();
  // What each unit's release sees: the padding already zero.
  std::vector<int> nonzero_at_release(2, -1);
  const auto count_nonzero = [](const bf16* p, int n) {
    int nonzero = 0;
    for (int i = 0; i < n; ++i) nonzero += to_float(p[i]) != 0.0f ? 1 : 0;
    return nonzero;
  };
  const bf16* out0 = arrays[0].out.data();
  work[0].released = [&, out0] {
    nonzero_at_release[0] = count_nonzero(out0 + 100, 28) + count_nonzero(out0 + 200, 56);
  };
  work[1].released = [&, alone_data] { nonzero_at_release[1] = count_nonzero(alone_data, 64); };
  for (auto& w : work) w.done = std::make_shared<std::promise<void>>();

  run_cpu_step_pipeline(work, optimizer->prepare_step(kStep, kLr, kScale), optimizer->threads(),
                        nullptr);
  up->synchronize();
  CHECK(nonzero_at_release == std::vector<int>{0, 0});
  CHECK(count_nonzero(alone.data(), 64) == 0);
  // The owned elements are the optimizer's own step; the padding is zero.
  std::vector<bf16> expected = reference[0].out;
  std::fill(expected.begin() + 100, expected.begin() + 128, to_bf16(0.0f));
  std::fill(expected.begin() + 200, expected.end(), to_bf16(0.0f));
  CHECK(std::memcmp(arrays[0].out.data(), expected.data(), bytes(256)) == 0);
  CHECK(std::memcmp(arrays[0].master.data(), reference[0].master.data(), 256 * sizeof(float)) == 0);
}

TEST_CASE("CPU step pipeline: an error reaches every unit not yet done, and the caller") {
  auto optimizer = adamw(3);
  SECTION("a unit's completion work throws") {
    auto piped = make_units(kSizes, 5);
    std::vector<CpuStepUnit> work(piped.size());
    for (std::size_t u = 0; u < piped.size(); ++u) {
      work[u].slices = slices_of(piped[u], kPiece);
      work[u].done = std::make_shared<std::promise<void>>();
    }
    work[1].after = [] { throw std::runtime_error("unit 1 cannot be finished"); };
    std::vector<std::shared_future<void>> done;
    for (auto& w : work) done.push_back(w.done->get_future().share());
    // Every unit is released exactly once, after its completion is set, failed or not: what the
    // copy stream waits for (a HostSignal raise) always comes.
    std::vector<std::atomic<int>> released(work.size());
    std::vector<std::atomic<int>> released_before_done(work.size());
    for (std::size_t u = 0; u < work.size(); ++u) {
      released[u] = 0;
      released_before_done[u] = 0;
      work[u].released = [&, u] {
        ++released[u];
        if (done[u].wait_for(std::chrono::seconds(0)) != std::future_status::ready)
          ++released_before_done[u];
      };
    }
    CHECK_THROWS_WITH(run_cpu_step_pipeline(work, optimizer->prepare_step(kStep, kLr, kScale),
                                            optimizer->threads(), nullptr),
                      "unit 1 cannot be finished");
    for (std::size_t u = 0; u < work.size(); ++u) {
      INFO("unit " << u);
      CHECK(released[u] == 1);
      CHECK(released_before_done[u] == 0);
    }
    done[0].wait();
    CHECK_NOTHROW(done[0].get());
    CHECK_THROWS_WITH(done[1].get(), "unit 1 cannot be finished");
    // Every later unit is done or failed with that error (one another thread finished before
    // the error is not told of it): none is left for the copy stream to wait on forever.
    for (std::size_t u = 2; u < done.size(); ++u) {
      INFO("unit " << u);
      REQUIRE(done[u].wait_for(std::chrono::seconds(0)) == std::future_status::ready);
      try {
        done[u].get();
      } catch (const std::runtime_error& e) {
        CHECK(std::string(e.what()) == "unit 1 cannot be finished");
      }
    }
  }
  SECTION("a piece's copy fails") {
    auto device = make_device(DeviceOptions{});
    std::unique_ptr<Stream> copy = device->create_stream("copy");
    copy->host_callback([] { throw std::runtime_error("copy down failed"); });
    std::unique_ptr<Event> landed = device->create_event();
    landed->record(*copy);
    auto piped = make_units({1000, 1000}, 6);
    const auto before = piped;
    std::vector<CpuStepUnit> work(2);
    for (std::size_t u = 0; u < 2; ++u) {
      work[u].slices = slices_of(piped[u], kPiece);
      work[u].done = std::make_shared<std::promise<void>>();
    }
    work[0].landed = {landed.get()};
    work[1].landed = {landed.get()};
    auto done1 = work[1].done->get_future();
    CHECK_THROWS_WITH(run_cpu_step_pipeline(work, optimizer->prepare_step(kStep, kLr, kScale),
                                            optimizer->threads(), nullptr),
                      Catch::Contains("copy down failed"));
    CHECK_THROWS_WITH(done1.get(), Catch::Contains("copy down failed"));
    // Nothing was written (no slice landed).
    for (std::size_t u = 0; u < 2; ++u) {
      CHECK(std::memcmp(piped[u].master.data(), before[u].master.data(), 1000 * sizeof(float)) ==
            0);
    }
  }
  SECTION("bad scalars are refused before anything runs") {
    CHECK_THROWS_WITH(optimizer->prepare_step(0, kLr, kScale), Catch::Contains("count from 1"));
    CHECK_THROWS_WITH(optimizer->prepare_step(1, kLr, std::nan("")),
                      Catch::Contains("grad_scale must be finite"));
  }
}

}  // namespace zrt
