// Stage 3 with stage3_max_reuse_distance (EngineOptions / ScheduleOptions): a training forward
// keeps the units its backward needs soon instead of releasing and gathering them again. The
// backward computes with the very values the forward gathered, so:
// - the parameters are bit-identical to plain stage 3 (and within test_engine_parity's bound of
//   the single-process reference), with accumulation, recompute and optimizer offload;
// - the all-gather bytes per step fall by exactly the gathers the schedule skips, counted from
//   the engine's own schedule, and nothing else changes.
#include <catch2/catch.hpp>

#include <mpi.h>

#include <map>

#include "tests/engine/engine_test_util.h"

using namespace zrt;
using namespace zrt::test;

namespace {

std::int64_t all_gather_bytes(const EngineRun& run) {
  return run.group->stats().snapshot().bytes[static_cast<std::size_t>(CollectiveOp::kAllGather)];
}

}  // namespace

TEST_CASE("stage 3 reuse distance: bit-identical to plain stage 3, fewer gathers exactly") {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  // Large enough to keep every unit the live bound (test_engine_options: 2000) allows.
  const std::int64_t keep_all = 1000000000;
  for (int accumulation : {1, 3}) {
    for (bool recompute : {false, true}) {
      for (bool offload : {false, true}) {
        TrainSpec spec;
        spec.steps = 4;
        spec.accumulation = accumulation;
        spec.clip = 0.05;
        spec.recompute = recompute;
        const auto reference = train_reference(spec, world);
        EngineOptions options = test_engine_options(3, accumulation);
        options.offload_optimizer.enabled = offload;
        auto plain = make_engine(options, spec);
        const auto plain_params = train_engine(*plain, spec);
        options.stage3_max_reuse_distance = keep_all;
        auto reuse = make_engine(options, spec);
        const auto got = train_engine(*reuse, spec);
        INFO("world " << world << " accumulation " << accumulation << " recompute " << recompute
                      << " offload " << offload);
        for (std::size_t p = 0; p < got.size(); ++p) {
          INFO("parameter " << reuse->model.parameters()[p].name);
          CHECK(relative_l2(got[p], reference[p]) <= 1e-6);
          CHECK(got[p] == plain_params[p]);  // bit for bit
        }
        for (std::size_t i = 0; i < reuse->results.size(); ++i)
          CHECK(reuse->results[i].grad_norm == plain->results[i].grad_norm);

        const int modules = reuse->model.modules();
        ScheduleOptions schedule = schedule_options(reuse->engine->options());
        const auto after =
            gathers_per_micro_batch(reuse->engine->plan(), modules, recompute, schedule);
        schedule.stage3_max_reuse_distance = 0;
        const auto before =
            gathers_per_micro_batch(reuse->engine->plan(), modules, recompute, schedule);
        std::int64_t skipped = 0;  // elements per micro-batch
        for (const auto& [unit, n] : before) {
          const int kept = n - (after.count(unit) ? after.at(unit) : 0);
          CHECK(kept >= 0);
          skipped += kept * reuse->engine->plan().unit(unit).numel;
        }
        if (world > 1) CHECK(skipped > 0);  // the test would prove nothing otherwise
        const std::int64_t element = dtype_size(options.compute_dtype);
        // (At one rank neither gathers: the model reads the slices in place.)
        CHECK(all_gather_bytes(*plain) - all_gather_bytes(*reuse) ==
              (world > 1 ? skipped * element * accumulation * spec.steps : 0));
        // Everything else moves the same bytes.
        const CommCounts a = plain->group->stats().snapshot();
        const CommCounts b = reuse->group->stats().snapshot();
        for (std::size_t op = 0; op < kNumCollectiveOps; ++op) {
          if (op == static_cast<std::size_t>(CollectiveOp::kAllGather)) continue;
          CHECK(a.bytes[op] == b.bytes[op]);
        }
      }
    }
  }
}
