// Optimizer offload (stages 1-3) and parameter offload (stage 3): the same parameters as
// without offload, bit for bit (at one rank where both runs form gradients alike); device and host
// bytes as the formulas say; the CPU optimizer overlapping the copies (shown without timing); and a
// model that only fits with offload.
#include <catch2/catch.hpp>

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <future>
#include <thread>

#include "runtime/common/error.h"
#include "tests/engine/engine_test_util.h"

using namespace zrt;
using namespace zrt::test;

namespace {

EngineOptions base_options(int stage, int accumulation) {
  EngineOptions o;
  o.stage = stage;
  o.gradient_accumulation_steps = accumulation;
  o.gradient_clipping = 0.05;
  o.reduce_bucket_size = 600;
  o.stage3_param_persistence_threshold = 30;
  o.stage3_prefetch_bucket_size = 700;
  o.stage3_max_live_parameters = 2000;
  o.offload_staging_buffers = 2;
  // Gradient slices come down in pieces of 100 elements: every unit's CPU step waits for
  // several (and the pieces cut parameters at odd offsets).
  o.offload_transfer_piece = 100;
  return o;
}

EngineOptions with_offload(EngineOptions o, bool params, bool pinned = true) {
  o.offload_optimizer.enabled = true;
  o.offload_optimizer.pin_memory = pinned;
  o.offload_param.enabled = params;
  o.offload_param.pin_memory = pinned;
  return o;
}

// The run's parameters and every step's gradient norm equal the plain run's, bit for bit.
void require_identical(const EngineRun& run, const std::vector<std::vector<float>>& got,
                       const EngineRun& plain, const std::vector<std::vector<float>>& expected) {
  REQUIRE(got.size() == expected.size());
  for (std::size_t p = 0; p < got.size(); ++p) {
    INFO("parameter " << p);
    REQUIRE(got[p] == expected[p]);
  }
  REQUIRE(run.results.size() == plain.results.size());
  for (std::size_t i = 0; i < plain.results.size(); ++i) {
    INFO("step " << i + 1);
    CHECK(run.results[i].grad_norm == plain.results[i].grad_norm);
  }
}

int world_size() {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  return world;
}

// Whether the offloaded run forms its gradients as the plain run does. At one rank the plain
// run accumulates full gradients (per_micro_batch_grads), while parameter offload and, at one
// micro-batch per step, optimizer offload (offload_takes_reduced_slices) still reduce a bucket
// a micro-batch: the same gradients added in another order (a tied parameter's two uses summed
// in the bucket first) and kept in the compute dtype until then.
bool same_gradient_path(const EngineOptions& plain, const EngineOptions& offloaded) {
  const bool alone = world_size() == 1;
  return per_micro_batch_grads(plain, alone) == per_micro_batch_grads(offloaded, alone);
}

// Where the paths differ: every parameter and norm within `bound` (relative) of the plain run's.
void require_close(const EngineRun& run, const std::vector<std::vector<float>>& got,
                   const EngineRun& plain, const std::vector<std::vector<float>>& expected,
                   double bound) {
  REQUIRE(got.size() == expected.size());
  double worst = 0.0;
  for (std::size_t p = 0; p < got.size(); ++p) {
    INFO("parameter " << p);
    const double err = relative_l2(got[p], expected[p]);
    worst = std::max(worst, err);
    CHECK(err <= bound);
  }
  REQUIRE(run.results.size() == plain.results.size());
  for (std::size_t i = 0; i < plain.results.size(); ++i) {
    INFO("step " << i + 1);
    const double a = run.results[i].grad_norm, b = plain.results[i].grad_norm;
    CHECK(std::abs(a - b) <= bound * std::abs(b));
  }
  WARN("gradient paths differ at one rank: worst parameter error " << worst << " (bound " << bound
                                                                   << ")");
}

// Where the paths differ in bf16 rounding (one rank, bf16 compute, fp32 accumulation): the plain
// run accumulates each gradient in fp32, the offloaded run rounds what the model writes into a
// bf16 bucket (unit roundoff u = 2^-8) once a micro-batch, twice for the tied weight (its two
// uses: the first write, then the sum). Where an element's contributions do not cancel, its
// gradient is thus off by eta <= 2u relative. Adam's update is lr * m^/(sqrt(v^) + eps) with eps
// far below these gradients (and clipping scales every gradient alike): m^ moves by at most
// eta * sum_k w_k |g_k| <= eta * c * sqrt(v^) (Cauchy-Schwarz on Adam's weights w, w' at betas
// 0.9/0.999: c = sqrt(sum_k w_k^2 / w'_k) = 1.0036 at step 3), sqrt(v^) by eta relative, so the
// update by at most lr * 2 c eta, and the element after `steps` steps by
// steps * lr * 4 c u (4.7e-4 for 3 steps at lr 1e-2; parameters are ~0.17, TiedMlp's uniform
// +-0.3). An element whose contributions (micro-batches, tied uses) nearly cancel can flip the
// sign of its gradient and move by up to Adam's largest step, 2 c lr a step. Such an element needs
// |sum c_i| <= r u sum |c_i| (r roundings), which with the cancellation ratio spread evenly over
// [0, 1] is one element in 1 / (r u) a step: at most ceil(steps * r * u * n) of a parameter's n
// elements may lie beyond the rounding bound. A fault (a slice lost, stale or another unit's)
// moves every element of its unit by a good fraction of lr a step: far past the first bound in
// every element. The gradient norm averages over the elements, so isolated cancellations barely
// move it: within 2u.
void require_close_to_rounding(const EngineRun& run, const std::vector<std::vector<float>>& got,
                               const EngineRun& plain,
                               const std::vector<std::vector<float>>& expected,
                               const TrainSpec& spec) {
  constexpr double u = 0x1p-8;
  constexpr double adam_ratio = 1.0036;  // c above, for up to 3 steps
  REQUIRE(spec.steps <= 3);
  const double rounding_bound = spec.steps * spec.lr * 4.0 * adam_ratio * u;
  const double adam_bound = spec.steps * spec.lr * 2.0 * adam_ratio;
  const std::vector<ParamSpec> specs = TiedMlp(kD, kH).parameters();
  REQUIRE(got.size() == expected.size());
  REQUIRE(got.size() == specs.size());
  for (std::size_t p = 0; p < got.size(); ++p) {
    INFO("parameter " << specs[p].name);
    REQUIRE(got[p].size() == expected[p].size());
    const int roundings = static_cast<int>(specs[p].modules.size()) * spec.accumulation;
    const auto allowed = static_cast<std::int64_t>(
        std::ceil(spec.steps * roundings * u * static_cast<double>(got[p].size())));
    std::int64_t beyond = 0;
    double worst = 0.0;
    for (std::size_t k = 0; k < got[p].size(); ++k) {
      const double diff = std::abs(static_cast<double>(got[p][k]) - expected[p][k]);
      worst = std::max(worst, diff);
      if (diff > rounding_bound) ++beyond;
    }
    INFO("elements beyond " << rounding_bound << ": " << beyond << " of " << got[p].size()
                            << " (at most " << allowed << "); largest difference " << worst);
    CHECK(beyond <= allowed);
    CHECK(worst <= adam_bound);
  }
  REQUIRE(run.results.size() == plain.results.size());
  for (std::size_t i = 0; i < plain.results.size(); ++i) {
    INFO("step " << i + 1);
    const double a = run.results[i].grad_norm, b = plain.results[i].grad_norm;
    CHECK(std::abs(a - b) <= 2.0 * u * std::abs(b));
  }
}

}  // namespace

TEST_CASE("offload gives bit-identical parameters at stages 1-3 (fp32)") {
  for (int accumulation : {1, 3}) {
    TrainSpec spec;
    spec.steps = 5;
    spec.accumulation = accumulation;
    spec.clip = 0.05;
    for (int stage = 1; stage <= 3; ++stage) {
      const EngineOptions plain_options = base_options(stage, accumulation);
      auto plain = make_engine(plain_options, spec);
      const auto expected = train_engine(*plain, spec);
      for (bool params : {false, true}) {
        if (params && stage != 3) continue;
        // Where the gradient paths differ (parameter offload at one rank) the first offloaded
        // run is the second's bit-for-bit reference, and close to the plain run: fp32 sums of
        // the same terms in another order, each rounding 2^-24 relative, the tied parameter's
        // (its two uses) and the accumulation's G micro-batches; 1e-5 leaves Adam's five
        // steps two orders of magnitude (a lost micro-batch is ~0.1).
        std::unique_ptr<EngineRun> first;
        std::vector<std::vector<float>> first_got;
        for (bool pinned : {true, false}) {
          // The split CPU step (the compute-dtype copy first, the state after) too: the same
          // arithmetic twice, the same bits.
          const bool split = pinned;
          EngineOptions o = with_offload(base_options(stage, accumulation), params, pinned);
          o.offload_split_step = split ? OffloadSplitStep::kOn : OffloadSplitStep::kAuto;
          auto offloaded = make_engine(o, spec);
          const auto got = train_engine(*offloaded, spec);
          INFO("stage " << stage << " G " << accumulation << " param offload " << params
                        << " pinned " << pinned << " split step " << split);
          if (same_gradient_path(plain_options, o)) {
            require_identical(*offloaded, got, *plain, expected);
          } else if (first == nullptr) {
            require_close(*offloaded, got, *plain, expected, 1e-5);
            first = std::move(offloaded);
            first_got = got;
          } else {
            require_identical(*offloaded, got, *first, first_got);
          }
        }
      }
    }
  }
}

TEST_CASE("offload stays bit-identical with random stream delays") {
  TrainSpec spec;
  spec.steps = 3;
  spec.accumulation = 2;
  spec.clip = 0.05;
  for (int stage = 1; stage <= 3; ++stage) {
    const EngineOptions plain_options = base_options(stage, 2);
    auto plain = make_engine(plain_options, spec);
    const auto expected = train_engine(*plain, spec);
    DeviceOptions delayed;
    delayed.stream_delay_max_us = 200;
    delayed.stream_delay_seed = 99;
    for (OffloadSplitStep split : {OffloadSplitStep::kOff, OffloadSplitStep::kOn}) {
      EngineOptions o = with_offload(base_options(stage, 2), stage == 3);
      o.offload_split_step = split;
      auto racy = make_engine(o, spec, delayed);
      const auto got = train_engine(*racy, spec);
      INFO("stage " << stage << " split step " << (split == OffloadSplitStep::kOn));
      if (same_gradient_path(plain_options, o)) {
        require_identical(*racy, got, *plain, expected);
      } else {
        // Parameter offload at one rank: its bits are those of the same run without delays.
        auto calm = make_engine(o, spec);
        const auto calm_got = train_engine(*calm, spec);
        require_identical(*racy, got, *calm, calm_got);
      }
    }
  }
}

TEST_CASE("an eval forward between the last backward and step() reads the parameters before it") {
  // A validation pass enqueued after the last micro-batch's backward and before step() reads the
  // parameters the step is about to replace. Nothing on the host waits for it, so the update's
  // writes (the copy up of an offloaded unit, the CPU's write of a host parameter slice, the
  // publication at stages 1-2) must be ordered after it on the device. The compute stream is held
  // for 30 ms before the eval's kernels: TiedMlp's CPU step takes well under a millisecond, so an
  // unordered write lands first, every time. The reference run lets the eval finish (the host
  // synchronises) before calling step(); the eval losses must match bit for bit.
  TrainSpec spec;
  spec.steps = 2;
  spec.clip = 0.05;
  struct Case {
    int stage;
    bool params;   // parameter offload (stage 3)
    double ratio;  // offload_optimizer.ratio (1: every unit on the host)
    int accumulation;
    OffloadSplitStep split;
    bool offload = true;
    int shard_size = 0;  // MiCS: shard groups of this many ranks
    int hpz = 0;         // hpZ: secondary shards over this many ranks
    bool qgz = false;    // zero_quantized_gradients
    bool qwz = false;    // zero_quantized_weights
  };
  std::vector<Case> cases;
  for (int stage = 1; stage <= 3; ++stage) {
    for (int accumulation : {1, 2}) {
      cases.push_back({stage, false, 1.0, accumulation, OffloadSplitStep::kOff});
      cases.push_back({stage, false, 1.0, accumulation, OffloadSplitStep::kOn});
      if (stage == 3) {
        cases.push_back({stage, true, 1.0, accumulation, OffloadSplitStep::kOff});
        cases.push_back({stage, false, 0.5, accumulation, OffloadSplitStep::kOff});
      }
    }
    cases.push_back({stage, false, 1.0, 1, OffloadSplitStep::kOff, /*offload=*/false});
  }
  // Stage 3's other gathers (from shard groups, from secondary shards, qwZ's) and qgZ's
  // reduction.
  const int world = world_size();
  if (world % 2 == 0) {
    cases.push_back({3, false, 1.0, 2, OffloadSplitStep::kOn, true, /*shard_size=*/2});
    cases.push_back({3, true, 1.0, 2, OffloadSplitStep::kOff, true, 0, /*hpz=*/2});
  }
  cases.push_back({3, false, 1.0, 1, OffloadSplitStep::kOn, true, 0, 0, /*qgz=*/true});
  cases.push_back({3, false, 1.0, 2, OffloadSplitStep::kOff, true, 0, 0, false, /*qwz=*/true});
  cases.push_back({3, false, 1.0, 1, OffloadSplitStep::kOn, true, 0, 0, true, true});
  const auto eval_losses = [&](const Case& c, bool let_eval_finish) {
    EngineOptions o = base_options(c.stage, c.accumulation);
    if (c.offload) o = with_offload(o, c.params);
    o.offload_optimizer.ratio = c.ratio;
    o.offload_split_step = c.split;
    o.hpz_partition_size = c.hpz;
    o.quantized_gradients = c.qgz;
    o.quantized_weights = c.qwz;
    TrainSpec s = spec;
    s.accumulation = c.accumulation;
    s.shard_size = c.shard_size;
    auto run = make_engine(o, s);
    const int rank = run->group->rank();
    const auto x = batch(1000, rank * kRows, kRows, 0);
    const auto t = batch(1000, rank * kRows, kRows, 1);
    std::vector<float> losses(static_cast<std::size_t>(spec.steps));
    for (int step = 0; step < spec.steps; ++step) {
      train_one_step(*run, s, step, [&] {
        run->compute->host_callback(
            [] { std::this_thread::sleep_for(std::chrono::milliseconds(30)); });
        run->model.forward_only(*run->engine, *run->compute, x.data(), t.data(), kRows,
                                &losses[static_cast<std::size_t>(step)]);
        if (let_eval_finish) run->compute->synchronize();
      });
    }
    return losses;
  };
  for (const Case& c : cases) {
    INFO("stage " << c.stage << (c.offload ? "" : " without offload") << " param offload "
                  << c.params << " ratio " << c.ratio << " G " << c.accumulation << " split step "
                  << (c.split == OffloadSplitStep::kOn) << " MiCS " << c.shard_size << " hpZ "
                  << c.hpz << " qgZ " << c.qgz << " qwZ " << c.qwz);
    const auto expected = eval_losses(c, true);
    const auto got = eval_losses(c, false);
    for (int step = 0; step < spec.steps; ++step) {
      INFO("step " << step + 1);
      CHECK(got[static_cast<std::size_t>(step)] == expected[static_cast<std::size_t>(step)]);
    }
  }
}

TEST_CASE("qwZ with optimizer offload: the parameters of qwZ without offload, bit for bit") {
  // qwZ quantizes each rank's whole parameter slice in blocks, the partition's padding included
  // (zero: partition.h). The offloaded update comes up through a staging buffer the CPU writes
  // only at owned elements; unless it zeroes the rest, the padding carries the previous unit's
  // bytes (or the allocation's), a block's scale takes them in, and that block's weights come
  // out wrong, differently from run to run. Every allocation starts as NaN bytes here
  // (DeviceOptions::poison_allocations), so a byte nobody wrote fails every time.
  DeviceOptions poisoned;
  poisoned.poison_allocations = true;
  // Plain stage 3, and at even world sizes MiCS (shard groups of 2: qwZ's gather inside the
  // group) and hpZ (secondary shards of 2, kept from the dequantized gather).
  struct Layout {
    const char* name;
    int shard_size;
    int hpz;
  };
  std::vector<Layout> layouts = {{"stage 3", 0, 0}};
  if (world_size() % 2 == 0) {
    layouts.push_back({"MiCS 2", 2, 0});
    layouts.push_back({"hpZ 2", 0, 2});
  }
  for (const Layout& layout : layouts) {
    const bool plain_layout = layout.shard_size == 0 && layout.hpz == 0;
    for (int accumulation : {1, 2}) {
      TrainSpec spec;
      spec.steps = 4;
      spec.accumulation = accumulation;
      spec.clip = 0.05;
      spec.shard_size = layout.shard_size;
      for (bool qgz : {false, true}) {
        EngineOptions plain_options = base_options(3, accumulation);
        plain_options.quantized_weights = true;
        plain_options.quantized_gradients = qgz;
        plain_options.hpz_partition_size = layout.hpz;
        auto plain = make_engine(plain_options, spec, poisoned);
        const auto expected = train_engine(*plain, spec);
        // (The other layouts once, with every unit on the host and the step in one pass.)
        for (const double ratio :
             plain_layout ? std::vector<double>{1.0, 0.5} : std::vector<double>{1.0}) {
          for (OffloadSplitStep split :
               plain_layout
                   ? std::vector<OffloadSplitStep>{OffloadSplitStep::kOff, OffloadSplitStep::kOn}
                   : std::vector<OffloadSplitStep>{OffloadSplitStep::kOff}) {
            EngineOptions o = with_offload(plain_options, false);
            o.offload_optimizer.ratio = ratio;
            o.offload_split_step = split;
            // At one rank and one micro-batch the offload reduces a bucket a micro-batch and the
            // plain run does not (same_gradient_path): other sums, compared in the first test.
            if (!same_gradient_path(plain_options, o)) continue;
            auto offloaded = make_engine(o, spec, poisoned);
            const auto got = train_engine(*offloaded, spec);
            INFO(layout.name << " G " << accumulation << " qgZ " << qgz << " ratio " << ratio
                             << " split step " << (split == OffloadSplitStep::kOn));
            require_identical(*offloaded, got, *plain, expected);
          }
        }
      }
    }
  }
}

TEST_CASE("offloaded state: device and host bytes follow the formulas") {
  const TiedMlp model(64, 128, 8);  // Ψ = 140352
  for (int stage = 1; stage <= 3; ++stage) {
    for (bool params : {false, true}) {
      if (params && stage != 3) continue;
      EngineOptions o = with_offload(base_options(stage, 2), params);
      o.compute_dtype = DType::kBFloat16;
      o.grad_accum_dtype = DType::kBFloat16;
      o.reduce_bucket_size = 140352 / 8;
      o.stage3_param_persistence_threshold = 0;
      o.stage3_prefetch_bucket_size = 2 * 16512;
      o.stage3_max_live_parameters = 4 * 16512;
      TrainSpec spec;
      spec.steps = 2;
      spec.accumulation = 2;
      auto run = make_engine(o, spec, {}, {}, model);
      train_engine(*run, spec);
      const auto& plan = run->engine->plan();
      const std::int64_t P = plan.total_numel();
      const std::int64_t n = run->group->size();
      std::int64_t largest = 0, shared = 0;
      for (const Unit& u : plan.units()) {
        largest = std::max(largest, u.numel);
        if (u.shared) shared += u.numel;
      }
      const MemoryUsage device = run->device->tracker().usage(MemorySpace::kDevice);
      const MemoryUsage host = run->device->tracker().usage(MemorySpace::kPinnedHost);
      INFO("stage " << stage << " param offload " << params << " world " << n << " device "
                    << device.model_state_peak);
      const auto cat = [](const MemoryUsage& u, MemCategory c) {
        return u.current[static_cast<int>(c)];
      };
      // Never on the device: fp32 master weights and moments. On the host: exactly 12Ψ/N of them.
      CHECK(device.peak[static_cast<int>(MemCategory::kMaster)] == 0);
      CHECK(device.peak[static_cast<int>(MemCategory::kOptimizer)] == 0);
      CHECK(cat(host, MemCategory::kMaster) + cat(host, MemCategory::kOptimizer) == 12 * P / n);
      const std::int64_t bucket = 2 * largest;
      switch (stage) {
        case 1:
          CHECK(device.model_state_peak == 4 * P);
          break;
        case 2:
          CHECK(device.model_state_peak >= 2 * P + 2 * P / n);
          CHECK(device.model_state_peak <= 2 * P + 2 * P / n + 2 * bucket + 2 * shared);
          break;
        case 3: {
          const std::int64_t working = 2 * (4 * 16512 + 2 * largest) + 2 * bucket + 2 * shared;
          if (params) {
            // Only the gathered working set (parameters in use and gradient buckets).
            CHECK(device.model_state_peak <= working);
            CHECK(cat(host, MemCategory::kParams) == 2 * P / n);
          } else {
            CHECK(device.model_state_peak >= 4 * P / n);
            CHECK(device.model_state_peak <= 4 * P / n + working);
          }
          break;
        }
      }
    }
  }
}

TEST_CASE("the CPU optimizer steps later units while earlier copies are still pending") {
  TrainSpec spec;
  spec.steps = 1;
  for (int stage : {2, 3}) {
    auto run = make_engine(with_offload(base_options(stage, 1), false), spec);
    const int units = static_cast<int>(run->engine->plan().units().size());
    REQUIRE(units >= 3);
    // One micro-batch, then hold the copy stream on a latch before stepping.
    const int rank = run->group->rank();
    auto x = batch(0, rank * kRows, kRows, 0);
    auto t = batch(0, rank * kRows, kRows, 1);
    float loss = 0.f;
    run->model.forward_backward(*run->engine, *run->compute, x.data(), t.data(), kRows, 1.0, &loss);
    std::promise<void> latch;
    std::shared_future<void> released = latch.get_future().share();
    Stream* copy = run->engine->copy_stream();
    REQUIRE(copy != nullptr);
    // The gradients' copies are already enqueued; the latch holds every parameter copy after.
    copy->host_callback([released] { released.wait(); });
    run->engine->step(1e-2);
    // With two staging buffers the CPU optimizer gets two units ahead of the copies.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    int updated = 0;
    while (std::chrono::steady_clock::now() < deadline) {
      updated = 0;
      for (int u = 0; u < units; ++u) updated += run->engine->offload_status(u).cpu_updated;
      if (updated >= 2) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    CHECK(updated >= 2);
    for (int u = 0; u < units; ++u) CHECK_FALSE(run->engine->offload_status(u).on_device);
    latch.set_value();
    copy->synchronize();
    run->compute->synchronize();
    for (int u = 0; u < units; ++u) CHECK(run->engine->offload_status(u).on_device);
  }
}

TEST_CASE("a failed CPU step is reported at a later step, and nothing waits for it forever") {
  TrainSpec spec;
  spec.steps = 4;
  for (int kind = 0; kind < 3; ++kind) {
    const bool params = kind == 1;
    INFO((params ? "parameter offload" : "optimizer offload") << (kind == 2 ? ", split step" : ""));
    EngineOptions o = with_offload(base_options(3, 1), params);
    if (kind == 2) o.offload_split_step = OffloadSplitStep::kOn;
    auto run = make_engine(o, spec);
    train_one_step(*run, spec, 0);
    // A fault on the copy stream: the next gradients never reach the host, so the CPU step
    // fails waiting for them (or for the copies up). Its units must still be released (the
    // copy stream waits for their signals) and the error must reach the training loop.
    run->engine->copy_stream()->host_callback(
        [] { throw std::runtime_error("copy engine fault"); });
    std::string error;
    try {
      for (int step = 1; step < spec.steps; ++step) train_one_step(*run, spec, step);
    } catch (const std::exception& e) {
      error = e.what();
    }
    CHECK_THAT(error, Catch::Contains("copy engine fault"));
  }  // and the engine shuts down with the failed streams (the test's timeout catches a hang)
}

TEST_CASE("a model that overflows a small device at stage 3 trains with offload") {
  const TiedMlp model(64, 128, 8);
  EngineOptions o = base_options(3, 1);
  o.compute_dtype = DType::kBFloat16;
  o.stage3_param_persistence_threshold = 0;
  o.stage3_prefetch_bucket_size = 2 * 16512;
  o.stage3_max_live_parameters = 4 * 16512;
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  // A device of 16Ψ/N bytes: stage 3 needs that for model state alone, plus its working set;
  // with both offloads only the working set stays on the device.
  DeviceOptions small;
  small.memory_limit_bytes = 16 * 140352 / world;
  TrainSpec spec;
  spec.steps = 2;
  CHECK_THROWS_AS(
      [&] {
        auto run = make_engine(o, spec, small, {}, model);
        train_engine(*run, spec);
      }(),
      OutOfMemory);
  auto run = make_engine(with_offload(o, true), spec, small, {}, model);
  train_engine(*run, spec);
  for (const auto& r : run->results) CHECK_FALSE(r.skipped);
}

// Partial offload (offload_optimizer.ratio, stage 3): the units the device steps and those the
// CPU steps give the same parameters and norms as plain stage 3, bit for bit; the split is the
// forward's last units, the fewest that hold the ratio; the state's bytes are exactly where the
// split says.
TEST_CASE("partial offload (offload_optimizer.ratio) is bit-identical and splits the state") {
  for (int accumulation : {1, 3}) {
    TrainSpec spec;
    spec.steps = 4;
    spec.accumulation = accumulation;
    spec.clip = 0.05;
    auto plain = make_engine(base_options(3, accumulation), spec);
    const auto expected = train_engine(*plain, spec);
    for (double ratio : {0.0, 0.3, 0.5, 0.8, 1.0}) {
      EngineOptions o = with_offload(base_options(3, accumulation), false);
      o.offload_optimizer.ratio = ratio;
      DeviceOptions delayed;  // the two sides' streams race: the result may not change
      delayed.stream_delay_max_us = accumulation == 3 ? 150 : 0;
      delayed.stream_delay_seed = 7;
      auto run = make_engine(o, spec, delayed);
      const auto got = train_engine(*run, spec);
      INFO("G " << accumulation << " ratio " << ratio);
      require_identical(*run, got, *plain, expected);

      // The split, from the plan by hand: walk the forward's order from its end.
      const PartitionPlan& plan = run->engine->plan();
      std::vector<int> order(plan.units().size());
      for (std::size_t u = 0; u < order.size(); ++u) order[u] = static_cast<int>(u);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
        return plan.unit(a).modules.front() < plan.unit(b).modules.front();
      });
      std::int64_t host = 0, first_host_shard = 0;
      bool suffix_started = false;
      for (int u : order) {
        const bool on_host = run->engine->state_on_host(u);
        if (on_host && !suffix_started) first_host_shard = plan.unit(u).shard;
        CHECK((!suffix_started || on_host));  // the offloaded units are a suffix
        suffix_started = suffix_started || on_host;
        if (on_host) host += plan.unit(u).shard;
      }
      const std::int64_t total = plan.total_shard();
      CHECK(static_cast<double>(host) >= ratio * static_cast<double>(total));
      if (host > 0) {  // the fewest: without its first unit the suffix falls short
        CHECK(static_cast<double>(host - first_host_shard) < ratio * static_cast<double>(total));
      }
      if (ratio == 1.0) CHECK(host == total);
      if (ratio == 0.0) CHECK(host == 0);

      // fp32 master + two moments: 12 bytes per owned element, on the side that steps it.
      const auto current = [&](MemorySpace space, MemCategory c) {
        return run->device->tracker().usage(space).current[static_cast<int>(c)];
      };
      const auto state_bytes = [&](MemorySpace space) {
        return current(space, MemCategory::kMaster) + current(space, MemCategory::kOptimizer);
      };
      CHECK(state_bytes(MemorySpace::kDevice) == 12 * (total - host));
      CHECK(state_bytes(MemorySpace::kPinnedHost) == 12 * host);
    }
  }
}

TEST_CASE("partial offload is refused where DeepSpeed refuses it, and out of range") {
  TrainSpec spec;
  for (int stage : {1, 2}) {
    EngineOptions o = with_offload(base_options(stage, 1), false);
    o.offload_optimizer.ratio = 0.5;
    CHECK_THROWS_WITH(make_engine(o, spec), Catch::Contains("needs ZeRO stage 3"));
  }
  EngineOptions o = with_offload(base_options(3, 1), true);
  o.offload_optimizer.ratio = 0.5;
  CHECK_THROWS_WITH(make_engine(o, spec), Catch::Contains("with offload_param"));
  o = with_offload(base_options(3, 1), false);
  o.offload_optimizer.ratio = 1.5;
  CHECK_THROWS_WITH(make_engine(o, spec), Catch::Contains("0..1"));
}

TEST_CASE("at one micro-batch per step the reduced slices go to the host as they are") {
  // offload_takes_reduced_slices: stages 2-3 at G = 1, the reduction in the compute dtype. The
  // offloaded units keep no device gradient slice, the host gradient is in the compute dtype
  // (with parameter offload: copied straight into it, not staged and accumulated), and nothing
  // else changes: the same parameters and norms as without offload, bit for bit. Where the rule
  // does not hold (G = 2, an fp32 reduction) the final slice is accumulated in grad_accum_dtype
  // (on the device, or on the host with parameter offload: an fp32 reduction's slice comes down
  // in fp32, so it too equals the run without offload).
  struct Case {
    int stage;
    double ratio;
    DType accum;
    int accumulation;
    bool fp32_wire;
    bool params = false;  // parameter offload too
  };
  const Case cases[] = {
      {2, 1.0, DType::kFloat32, 1, false},       {3, 1.0, DType::kFloat32, 1, false},
      {3, 0.5, DType::kFloat32, 1, false},       {3, 1.0, DType::kBFloat16, 1, false},
      {3, 0.5, DType::kBFloat16, 1, false},      {3, 1.0, DType::kFloat32, 2, false},
      {3, 1.0, DType::kFloat32, 1, true},        {2, 1.0, DType::kFloat32, 1, true},
      {3, 1.0, DType::kFloat32, 1, false, true}, {3, 1.0, DType::kBFloat16, 1, false, true},
      {3, 1.0, DType::kFloat32, 1, true, true},  {3, 1.0, DType::kFloat32, 2, false, true},
  };
  for (const Case& c : cases) {
    EngineOptions o = base_options(c.stage, c.accumulation);
    o.compute_dtype = DType::kBFloat16;
    o.grad_accum_dtype = c.accum;
    if (c.fp32_wire) o.communication_dtype = DType::kFloat32;
    TrainSpec spec;
    spec.steps = 3;
    spec.accumulation = c.accumulation;
    spec.clip = 0.05;
    auto plain = make_engine(o, spec);
    const auto expected = train_engine(*plain, spec);
    EngineOptions oo = with_offload(o, c.params);
    oo.offload_optimizer.ratio = c.ratio;
    const bool direct = c.accumulation == 1 && !c.fp32_wire;
    CHECK(offload_takes_reduced_slices(oo) == direct);
    DeviceOptions delayed;  // the copy reads the bucket while the compute stream moves on
    delayed.stream_delay_max_us = 150;
    delayed.stream_delay_seed = 11;
    auto run = make_engine(oo, spec, delayed);
    const auto got = train_engine(*run, spec);
    INFO("stage " << c.stage << " ratio " << c.ratio << " accum " << dtype_name(c.accum) << " G "
                  << c.accumulation << " fp32 reduction " << c.fp32_wire << " param offload "
                  << c.params);
    if (same_gradient_path(o, oo)) {
      require_identical(*run, got, *plain, expected);
    } else {
      // At one rank the plain run accumulates full gradients, in fp32 where the bucket rounds
      // what the model writes to bf16 (with a bf16 accumulation both round alike: identical).
      require_close_to_rounding(*run, got, *plain, expected, spec);
    }
    // Gradient bytes after the step (the buckets are gone): on the device a slice per unit the
    // device steps (every unit where the rule does not hold), in grad_accum_dtype; in host
    // memory a slice per offloaded unit, in the compute dtype where the rule holds.
    const PartitionPlan& plan = run->engine->plan();
    std::int64_t host_shard = 0;
    for (std::size_t u = 0; u < plan.units().size(); ++u) {
      if (run->engine->state_on_host(static_cast<int>(u))) host_shard += plan.unit(u).shard;
    }
    REQUIRE(host_shard > 0);
    const std::int64_t total = plan.total_shard();
    const auto grads = [&](MemorySpace space) {
      return run->device->tracker().usage(space).current[static_cast<int>(MemCategory::kGrads)];
    };
    const std::int64_t accum_bytes = static_cast<std::int64_t>(dtype_size(c.accum));
    const std::int64_t device_slices = c.params ? 0 : direct ? total - host_shard : total;
    CHECK(grads(MemorySpace::kDevice) == device_slices * accum_bytes);
    CHECK(grads(MemorySpace::kPinnedHost) == host_shard * (direct ? 2 : accum_bytes));
    if (c.params) {
      // Host workspace: the ring carrying updated slices up (2 bf16 slices here), and only where
      // the host accumulates, the fp32-sized buffer each reduced slice lands in first.
      std::int64_t max_shard = 0;
      for (const Unit& unit : plan.units()) max_shard = std::max(max_shard, unit.shard);
      const auto& host = run->device->tracker().usage(MemorySpace::kPinnedHost).current;
      CHECK(host[static_cast<int>(MemCategory::kWorkspace)] ==
            2 * 2 * max_shard + (direct ? 0 : 4 * max_shard));
    }
  }
}

// initialize() writes the master weights alone (assign_state's master_only): the optimizer state
// of the units on the device is zeroed there and that of the offloaded units in host memory.
// Trained first, so that nothing is zero by accident (fresh memory often is).
TEST_CASE("initialize again after training: the optimizer state is zero on both sides") {
  TrainSpec spec;
  spec.steps = 2;
  EngineOptions o = with_offload(base_options(3, 1), false);
  o.offload_optimizer.ratio = 0.5;
  auto run = make_engine(o, spec);
  train_engine(*run, spec);
  // The moments are not zero before.
  const PartitionPlan& plan = run->engine->plan();
  const auto trained = run->engine->host_state();
  bool moved = false;
  for (std::size_t u = 0; u < trained.size(); ++u) {
    const std::int64_t n = plan.unit(static_cast<int>(u)).shard;
    for (std::size_t a = 1; a < trained[u].size(); ++a) {
      moved =
          moved || std::any_of(trained[u][a], trained[u][a] + n, [](float v) { return v != 0.0f; });
    }
  }
  int moved_anywhere = moved ? 1 : 0;  // some ranks' slices are all padding at 4 ranks
  MPI_Allreduce(MPI_IN_PLACE, &moved_anywhere, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
  CHECK(moved_anywhere == 1);
  run->engine->initialize([](int p, std::int64_t first, std::int64_t count, float* out) {
    for (std::int64_t i = 0; i < count; ++i) out[i] = TiedMlp::init_value(p, first + i);
  });
  const auto state = run->engine->host_state();
  int on_host = 0;
  for (std::size_t u = 0; u < state.size(); ++u) {
    const Unit& unit = plan.unit(static_cast<int>(u));
    on_host += run->engine->state_on_host(static_cast<int>(u)) ? 1 : 0;
    for (std::size_t a = 1; a < state[u].size(); ++a) {
      INFO("unit " << u << " state array " << a);
      CHECK(std::all_of(state[u][a], state[u][a] + unit.shard, [](float v) { return v == 0.0f; }));
    }
  }
  CHECK(on_host > 0);
  CHECK(on_host < static_cast<int>(state.size()));
  // The parameters are the initial ones again (counted, not required: full_parameter is
  // collective, and a rank leaving early would hang the others).
  int differing = 0;
  for (int p = 0; p < static_cast<int>(run->model.parameters().size()); ++p) {
    const auto values = run->engine->full_parameter(p);
    for (std::size_t i = 0; i < values.size(); ++i) {
      differing += values[i] != TiedMlp::init_value(p, static_cast<std::int64_t>(i)) ? 1 : 0;
    }
  }
  CHECK(differing == 0);
}
