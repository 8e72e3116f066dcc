// The step's global decision taken on the device (ZeroEngine::enqueue_step, step_decision.h):
// its arithmetic against values worked out by hand; steps enqueued back to back with the
// decision left on the device give the bits step() gives, and the bits of the host's decision
// (optimizer offload takes it there), a skipped step included; the counters wait for it.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "runtime/common/error.h"
#include "runtime/engine/engine_kernels.h"
#include "runtime/engine/step_decision.h"
#include "tests/engine/engine_test_util.h"

using namespace zrt;
using namespace zrt::test;

namespace {

// The micro-batches of step `step` (as train_one_step), the last rank's loss scale NaN at
// `poisoned_step`: its gradients, and so the reduced ones of every rank, are NaN. Nothing waits
// for the compute stream here, so what its work reads or writes lives in `keep`: the inputs and
// the slot the loss is written to.
void run_micro_batches(EngineRun& run, const TrainSpec& spec, int step, int poisoned_step,
                       std::vector<std::vector<float>>& keep) {
  const int rank = run.group->rank();
  const int world = run.group->size();
  keep.emplace_back(1, 0.f);
  float* loss = keep.back().data();  // a heap slot: keep's reallocations move, not free, it
  for (int g = 0; g < spec.accumulation; ++g) {
    const std::int64_t first = (static_cast<std::int64_t>(g) * world + rank) * kRows;
    keep.push_back(batch(step, first, kRows, 0, run.model.d()));
    keep.push_back(batch(step, first, kRows, 1, run.model.d()));
    const bool poison = step == poisoned_step && rank == world - 1 && g == spec.accumulation - 1;
    const float scale = poison ? std::numeric_limits<float>::quiet_NaN()
                               : static_cast<float>(run.engine->loss_scale());
    run.model.forward_backward(*run.engine, *run.compute, keep[keep.size() - 2].data(),
                               keep.back().data(), kRows, scale, loss);
  }
}

std::vector<std::vector<float>> all_parameters(EngineRun& run) {
  std::vector<std::vector<float>> out;
  for (int p = 0; p < static_cast<int>(run.model.parameters().size()); ++p) {
    out.push_back(run.engine->full_parameter(p));
  }
  return out;
}

EngineOptions options_for(int stage, int accumulation, bool offload) {
  EngineOptions o = test_engine_options(stage, accumulation);
  o.offload_optimizer.enabled = offload;
  return o;
}

// Every parameter, bit for bit.
void require_same_parameters(const std::vector<std::vector<float>>& got,
                             const std::vector<std::vector<float>>& expected, const char* what) {
  REQUIRE(got.size() == expected.size());
  for (std::size_t p = 0; p < got.size(); ++p) {
    INFO(what << ", parameter " << p);
    REQUIRE(got[p] == expected[p]);
  }
}

bool same_norm(double a, double b) {
  return (std::isnan(a) && std::isnan(b)) || a == b;
}

}  // namespace

TEST_CASE("the step decision's arithmetic") {
  // norm^2 = 36 summed over 3 micro-batches at loss scale 1: the norm of the average is 2.
  const StepDecisionInputs in{3.0, 0.0};
  CHECK(step_grad_norm(36.0f, in) == 2.0);
  StepDecision d = decide_step(36.0f, in);
  CHECK(d.apply == 1);
  CHECK(d.grad_scale == static_cast<float>(1.0 / 3.0));  // the average, no clipping

  // Clipping at 0.5: DeepSpeed's coefficient 0.5 / (2 + 1e-6) on top of the average.
  d = decide_step(36.0f, StepDecisionInputs{3.0, 0.5});
  CHECK(d.apply == 1);
  CHECK(d.grad_scale == static_cast<float>(1.0 / 3.0 * (0.5 / (2.0 + 1e-6))));
  // Clipping above the norm leaves the average alone.
  d = decide_step(36.0f, StepDecisionInputs{3.0, 4.0});
  CHECK(d.grad_scale == static_cast<float>(1.0 / 3.0));

  // A non-finite norm: no update.
  CHECK(decide_step(std::numeric_limits<float>::infinity(), in).apply == 0);
  CHECK(decide_step(std::numeric_limits<float>::quiet_NaN(), StepDecisionInputs{1.0, 1.0}).apply ==
        0);
  CHECK(std::isnan(step_grad_norm(std::numeric_limits<float>::quiet_NaN(), in)));
}

TEST_CASE("the decision kernel, stream-ordered, writes what decide_step gives") {
  auto device = make_device(DeviceOptions{});
  auto stream = device->create_stream("decision");
  Buffer norm = device->allocate(4, MemCategory::kWorkspace, "norm");
  Buffer out = device->allocate(sizeof(StepDecision), MemCategory::kWorkspace, "decision");
  for (float norm_squared : {0.0f, 1e-30f, 2.5f, 1e30f, std::numeric_limits<float>::infinity()}) {
    device->copy_to_device(norm.device<std::byte>(), &norm_squared, 4, *stream);
    const StepDecisionInputs in{8.0, 1.0};
    engine_kernels::decide_step(*device, *stream, norm.device<float>(), in,
                                out.device<StepDecision>());
    StepDecision got;
    device->copy_to_host(&got, out.device<std::byte>(), sizeof got, *stream);
    stream->synchronize();
    const StepDecision expected = decide_step(norm_squared, in);
    INFO("norm^2 " << norm_squared);
    CHECK(got.apply == expected.apply);
    CHECK(got.grad_scale == expected.grad_scale);
  }
}

TEST_CASE(
    "steps enqueued with the decision on the device give step()'s bits and the host "
    "decision's, a skipped step included") {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const int steps = 6, poisoned = 2;  // the third step is skipped on every rank
  for (bool lion : {false, true}) {
    for (int stage = 0; stage <= 3; ++stage) {
      TrainSpec spec;
      spec.steps = steps;
      spec.accumulation = 2;
      spec.lion = lion;
      INFO((lion ? "Lion" : "AdamW") << " stage " << stage);

      // step(): enqueue and settle at once.
      auto settled = make_engine(options_for(stage, 2, false), spec);
      REQUIRE(settled->engine->decides_on_device());
      std::vector<std::vector<float>> keep;
      std::vector<StepResult> settled_results;
      for (int step = 0; step < steps; ++step) {
        run_micro_batches(*settled, spec, step, poisoned, keep);
        settled_results.push_back(settled->engine->step(spec.lr));
        REQUIRE(settled_results.back().decided);
      }
      const auto expected = all_parameters(*settled);

      // Back to back, as the trainer's quiet steps: each step's decision is read only when the
      // next one is enqueued (no host wait in between), the last one at the end.
      auto deferred = make_engine(options_for(stage, 2, false), spec);
      std::vector<StepResult> deferred_results;
      for (int step = 0; step < steps; ++step) {
        run_micro_batches(*deferred, spec, step, poisoned, keep);
        if (step > 0) {
          deferred_results.push_back(deferred->engine->settle_step());
          REQUIRE(deferred_results.back().decided);
        }
        const StepResult r = deferred->engine->enqueue_step(spec.lr);
        CHECK_FALSE(r.decided);
        CHECK(r.optimizer_steps == step - (step > poisoned ? 1 : 0));  // the steps before it
      }
      deferred_results.push_back(deferred->engine->settle_step());
      require_same_parameters(all_parameters(*deferred), expected, "back to back");
      REQUIRE(deferred_results.size() == settled_results.size());
      for (std::size_t i = 0; i < settled_results.size(); ++i) {
        INFO("step " << i + 1);
        CHECK(deferred_results[i].skipped == (static_cast<int>(i) == poisoned));
        CHECK(settled_results[i].skipped == (static_cast<int>(i) == poisoned));
        CHECK(same_norm(deferred_results[i].grad_norm, settled_results[i].grad_norm));
      }
      const EngineCounters c = deferred->engine->counters();
      CHECK(c.optimizer_steps == steps - 1);
      CHECK(c.skipped_steps == 1);

      // Optimizer offload takes the decision on the host (the CPU optimizer needs the norm
      // there): the same bits again. Stages 1-3 (DeepSpeed has no offload at stage 0).
      if (stage == 0) continue;
      auto offloaded = make_engine(options_for(stage, 2, true), spec);
      REQUIRE_FALSE(offloaded->engine->decides_on_device());
      for (int step = 0; step < steps; ++step) {
        run_micro_batches(*offloaded, spec, step, poisoned, keep);
        const StepResult r = offloaded->engine->enqueue_step(spec.lr);
        CHECK(r.decided);  // enqueue_step is step() here
        CHECK(r.skipped == (step == poisoned));
        CHECK(same_norm(r.grad_norm, settled_results[static_cast<std::size_t>(step)].grad_norm));
      }
      require_same_parameters(all_parameters(*offloaded), expected, "offload");
    }
  }
}

TEST_CASE("the decision's order across streams holds with random stream delays") {
  // Above one rank the norm is summed and the decision taken on the comm stream, and the
  // optimizer on the compute stream reads it: random delays before every stream work item make
  // a missing wait read a stale or unwritten decision (a wrong update, or a skip missed).
  TrainSpec spec;
  spec.steps = 5;
  spec.accumulation = 2;
  for (int stage = 1; stage <= 3; ++stage) {
    INFO("stage " << stage);
    auto plain = make_engine(options_for(stage, 2, false), spec);
    std::vector<std::vector<float>> keep;
    for (int step = 0; step < spec.steps; ++step) {
      run_micro_batches(*plain, spec, step, 1, keep);
      plain->engine->step(spec.lr);
    }
    const auto expected = all_parameters(*plain);
    DeviceOptions delayed;
    delayed.stream_delay_max_us = 300;
    delayed.stream_delay_seed = 7;
    auto racy = make_engine(options_for(stage, 2, false), spec, delayed);
    for (int step = 0; step < spec.steps; ++step) {
      run_micro_batches(*racy, spec, step, 1, keep);
      racy->engine->enqueue_step(spec.lr);
    }
    CHECK(racy->engine->settle_step().skipped_steps == 1);
    require_same_parameters(all_parameters(*racy), expected, "delayed streams");
  }
}

TEST_CASE("the counters wait for a decision left on the device") {
  TrainSpec spec;
  spec.steps = 1;
  auto run = make_engine(options_for(2, 1, false), spec);
  std::vector<std::vector<float>> keep;
  run_micro_batches(*run, spec, 0, -1, keep);
  const StepResult r = run->engine->enqueue_step(spec.lr);
  REQUIRE_FALSE(r.decided);
  CHECK(r.optimizer_steps == 0);
  // Checkpoints save the counters: an undecided step would be saved as not taken.
  CHECK_THROWS_WITH(run->engine->counters(), Catch::Contains("settle_step() first"));
  const StepResult settled = run->engine->settle_step();
  CHECK(settled.decided);
  CHECK_FALSE(settled.skipped);
  CHECK(settled.optimizer_steps == 1);
  CHECK(settled.grad_norm > 0.0);
  CHECK(run->engine->counters().optimizer_steps == 1);
  // Idempotent.
  CHECK(run->engine->settle_step().optimizer_steps == 1);
}
