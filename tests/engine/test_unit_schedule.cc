// The engine's schedule without a device: the exact operations of a micro-batch at stage 3
// (gather, prefetch within the budget and the live bound, release, rotating and pinned buckets,
// reductions), the stage 0-2 reduction rules over accumulation, the refused calls, and the
// peaks zrt-mem takes from it against values worked out by hand.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "runtime/common/error.h"
#include "runtime/engine/unit_schedule.h"

using namespace zrt;

namespace {

using K = UnitOpKind;

// Three modules of 64 elements each (one unit each at stage 3), no tied parameter.
std::vector<ParamSpec> chain() {
  return {{"m0.w", {8, 8}, {0}, false}, {"m1.w", {8, 8}, {1}, false}, {"m2.w", {8, 8}, {2}, false}};
}

PartitionPlan plan_of(const std::vector<ParamSpec>& params, int stage, int modules) {
  PartitionOptions o;
  o.stage = stage;
  o.world = 1;
  o.bucket_elements = 64;  // one module per bucket at stages 0-2
  o.persistence_threshold = 0;
  o.alignment = 4;
  o.num_modules = modules;
  return PartitionPlan(params, o);
}

std::string show(const std::vector<UnitOp>& ops) {
  std::string s;
  for (const UnitOp& op : ops) {
    s += std::string(unit_op_name(op.kind)) + "(" + std::to_string(op.unit) +
         (op.final ? ",final" : "") + ") ";
  }
  return s;
}

// A training forward over modules 0..modules-1, the operations dropped.
void forward_pass(UnitSchedule& s, int modules) {
  for (int m = 0; m < modules; ++m) {
    s.acquire(m, Phase::kForward);
    s.release(m, Phase::kForward);
  }
}

// The same stage 0-2 plan of `params` over four modules, one module per bucket.
PartitionPlan bucket_plan(const std::vector<ParamSpec>& params, PartitionOptions po, int stage) {
  po.stage = stage;
  po.bucket_elements = 64;
  return PartitionPlan(params, po);
}

}  // namespace

TEST_CASE("stage 3 without prefetch: gather before use, release after, buckets rotate") {
  const auto params = chain();
  const PartitionPlan plan = plan_of(params, 3, 3);
  const int u0 = plan.module_units(0)[0], u1 = plan.module_units(1)[0],
            u2 = plan.module_units(2)[0];
  ScheduleOptions o;
  o.stage = 3;
  o.stage3_prefetch_bucket_size = 0;
  UnitSchedule s(plan, 3, o);
  using V = std::vector<UnitOp>;
  // Forward: each module gathers its unit and, since the next module does not use it, frees it.
  CHECK(show(s.acquire(0, Phase::kForward)) ==
        show(V{{K::kIssueGather, u0}, {K::kAwaitGather, u0}}));
  CHECK(show(s.release(0, Phase::kForward)) == show(V{{K::kReleaseGather, u0}}));
  s.acquire(1, Phase::kForward);
  s.release(1, Phase::kForward);
  CHECK(show(s.acquire(2, Phase::kForward)) ==
        show(V{{K::kIssueGather, u2}, {K::kAwaitGather, u2}}));
  // The last forward module is kept for its backward, which gathers nothing.
  CHECK(s.release(2, Phase::kForward).empty());
  CHECK(show(s.acquire(2, Phase::kBackward)) ==
        show(V{{K::kAwaitGather, u2}, {K::kOpenBucket, u2}}));
  // In the backward the next module's gather goes on the comm stream ahead of this module's
  // reduction (after this module's parameters are released, so no more is live than at the next
  // acquire).
  CHECK(show(s.release(2, Phase::kBackward)) ==
        show(V{{K::kReleaseGather, u2}, {K::kIssueGather, u1}, {K::kIssueReduce, u2, true}}));
  // The next bucket frees the previous one (after its reduction) before it is allocated.
  CHECK(show(s.acquire(1, Phase::kBackward)) ==
        show(V{{K::kAwaitGather, u1}, {K::kFreeBucket, u2}, {K::kOpenBucket, u1}}));
  CHECK(show(s.release(1, Phase::kBackward)) ==
        show(V{{K::kReleaseGather, u1}, {K::kIssueGather, u0}, {K::kIssueReduce, u1, true}}));
  s.acquire(0, Phase::kBackward);
  // Module 0's backward ends the micro-batch: the last bucket goes too.
  CHECK(show(s.release(0, Phase::kBackward)) ==
        show(V{{K::kReleaseGather, u0}, {K::kIssueReduce, u0, true}, {K::kFreeBucket, u0}}));
  CHECK(s.micro_batch() == 1);
  CHECK(s.live_gathered_elements() == 0);
  CHECK(s.live_bucket_elements() == 0);
  // gradient_accumulation_steps is 1: another backward needs step() first.
  CHECK_THROWS_WITH(
      s.acquire(2, Phase::kBackward),
      Catch::Contains("backward of micro-batch 2 but gradient_accumulation_steps is 1"));
  s.step();
  CHECK_NOTHROW(s.acquire(0, Phase::kForward));
  CHECK_THROWS_WITH(s.acquire(3, Phase::kForward), Catch::Contains("module 3 outside 0..2"));
}

TEST_CASE("two rotating buckets: a unit's reduction overlaps the next unit's backward") {
  const auto params = chain();
  for (int stage : {2, 3}) {
    INFO("stage " << stage);
    const PartitionPlan plan = plan_of(params, stage, 3);
    const std::int64_t n = plan.unit(0).numel;
    const int u0 = plan.module_units(0)[0], u1 = plan.module_units(1)[0],
              u2 = plan.module_units(2)[0];
    ScheduleOptions o;
    o.stage = stage;
    o.stage3_prefetch_bucket_size = 0;
    o.rotating_buckets = 2;  // the engine's overlap_comm
    UnitSchedule s(plan, 3, o);
    for (int m = 0; m < 3; ++m) {
      s.acquire(m, Phase::kForward);
      s.release(m, Phase::kForward);
    }
    const auto buckets = [](const std::vector<UnitOp>& ops) {
      std::vector<UnitOp> kept;
      for (const UnitOp& op : ops) {
        if (op.kind == K::kOpenBucket || op.kind == K::kFreeBucket) kept.push_back(op);
      }
      return kept;
    };
    using V = std::vector<UnitOp>;
    CHECK(show(buckets(s.acquire(2, Phase::kBackward))) == show(V{{K::kOpenBucket, u2}}));
    s.release(2, Phase::kBackward);
    // Unit 2's bucket stays while it is reduced: module 1's backward opens its own beside it.
    CHECK(show(buckets(s.acquire(1, Phase::kBackward))) == show(V{{K::kOpenBucket, u1}}));
    CHECK(s.live_bucket_elements() == 2 * n);
    s.release(1, Phase::kBackward);
    // The third frees the oldest (after its reduction) first.
    CHECK(show(buckets(s.acquire(0, Phase::kBackward))) ==
          show(V{{K::kFreeBucket, u2}, {K::kOpenBucket, u0}}));
    CHECK(show(buckets(s.release(0, Phase::kBackward))) ==
          show(V{{K::kFreeBucket, u1}, {K::kFreeBucket, u0}}));
    CHECK(s.live_bucket_elements() == 0);
    CHECK(schedule_peaks(plan, 3, o, {false, false, false}).bucket_elements == 2 * n);
  }
  ScheduleOptions bad;
  bad.rotating_buckets = 0;
  const PartitionPlan plan = plan_of(params, 2, 3);
  CHECK_THROWS_WITH(UnitSchedule(plan, 3, bad), Catch::Contains("rotating_buckets must be >= 1"));
}

// model.frozen splits a module's parameters into a trained and a frozen unit (and at stages
// 0-2 into buckets whose modules may overlap): every unit a module uses has its bucket open
// through that module's backward, whatever the rotation's count; what rotation frees is
// finished; a frozen bucket (never reduced) goes after its last module and takes no place in
// the rotation, so with two rotating buckets a reduction still has a whole module's backward
// to run before its bucket is waited for and freed.
TEST_CASE("frozen units: a module's trained and frozen buckets are open together") {
  // Four modules, each with a trained weight w and a frozen one v.
  std::vector<ParamSpec> params;
  for (int m = 0; m < 4; ++m) {
    params.push_back({"m" + std::to_string(m) + ".w", {8, 8}, {m}, false});
    params.push_back({"m" + std::to_string(m) + ".v", {8, 8}, {m}, false});
    params.back().frozen = true;
  }
  for (int stage : {2, 3}) {
    // Stages 0-2: buckets of one module (64), or of two (128: they then span modules).
    for (std::int64_t bucket : {64, 128}) {
      for (int rotating : {1, 2}) {
        if (stage == 3 && bucket == 128) continue;
        INFO("stage " << stage << ", bucket " << bucket << ", rotating buckets " << rotating);
        PartitionOptions po;
        po.stage = stage;
        po.bucket_elements = bucket;
        po.alignment = 4;
        po.num_modules = 4;
        const PartitionPlan plan(params, po);
        ScheduleOptions o;
        o.stage = stage;
        o.stage3_prefetch_bucket_size = 0;
        o.rotating_buckets = rotating;
        UnitSchedule s(plan, 4, o);
        for (int m = 0; m < 4; ++m) {
          s.acquire(m, Phase::kForward);
          s.release(m, Phase::kForward);
        }
        for (int m = 3; m >= 0; --m) {
          for (const UnitOp& op : s.acquire(m, Phase::kBackward)) {
            if (op.kind != K::kFreeBucket) continue;
            const Unit& unit = plan.unit(op.unit);
            CHECK_FALSE(unit.frozen);  // freed at its last module's release instead
            // Finished, and with two buckets rotating, a module's backward ago.
            CHECK(unit.last_backward_module > m + (rotating == 2 ? 1 : 0));
          }
          for (int u : plan.module_units(m)) CHECK(s.bucket_open(u));
          for (const UnitOp& op : s.release(m, Phase::kBackward)) {
            if (op.kind == K::kFreeBucket && plan.unit(op.unit).frozen) {
              CHECK(plan.unit(op.unit).last_backward_module == m);
            }
          }
        }
        CHECK(s.live_bucket_elements() == 0);
      }
    }
  }
}

// A model that never asks for a frozen parameter's gradient (Model::skips_frozen_gradients;
// ScheduleOptions::frozen_buckets false): no frozen unit opens a bucket, at any stage, while the
// trained units' buckets open as before (stages 2-3: every module's; stages 0-1: none, the full
// gradients take them), so the largest bucket memory live is the trained units' alone.
TEST_CASE("frozen units open no bucket when the model skips their gradients") {
  std::vector<ParamSpec> params;
  for (int m = 0; m < 4; ++m) {
    params.push_back({"m" + std::to_string(m) + ".w", {8, 8}, {m}, false});
    params.push_back({"m" + std::to_string(m) + ".v", {8, 8}, {m}, false});
    params.back().frozen = true;
  }
  for (int stage = 0; stage <= 3; ++stage) {
    for (bool frozen_buckets : {true, false}) {
      INFO("stage " << stage << ", frozen buckets " << frozen_buckets);
      PartitionOptions po;
      po.stage = stage;
      po.world = stage == 0 ? 1 : 2;
      po.bucket_elements = 64;
      po.alignment = 4;
      po.num_modules = 4;
      const PartitionPlan plan(params, po);
      ScheduleOptions o;
      o.stage = stage;
      o.gradient_accumulation_steps = 2;
      o.stage3_prefetch_bucket_size = 0;
      o.rotating_buckets = 2;
      o.frozen_buckets = frozen_buckets;
      UnitSchedule s(plan, 4, o);
      int frozen_opened = 0, trained_opened = 0;
      std::int64_t peak = 0;
      for (int micro = 0; micro < 2; ++micro) {
        for (int m = 0; m < 4; ++m) {
          s.acquire(m, Phase::kForward);
          s.release(m, Phase::kForward);
        }
        for (int m = 3; m >= 0; --m) {
          for (const UnitOp& op : s.acquire(m, Phase::kBackward)) {
            if (op.kind != K::kOpenBucket) continue;
            ++(plan.unit(op.unit).frozen ? frozen_opened : trained_opened);
          }
          peak = std::max(peak, s.live_bucket_elements());
          for (int u : plan.module_units(m)) {
            if (plan.unit(u).frozen) CHECK(s.bucket_open(u) == frozen_buckets);
          }
          s.release(m, Phase::kBackward);
        }
        CHECK(s.live_bucket_elements() == 0);
      }
      // Two micro-batches of four modules, a unit of each kind per module.
      CHECK(frozen_opened == (frozen_buckets ? 8 : 0));
      CHECK(trained_opened == (stage >= 2 ? 8 : 0));
      // Live at once: at most two rotating trained buckets, plus the module's frozen one.
      CHECK(peak == (stage >= 2 ? 2 * 64 : 0) + (frozen_buckets ? 64 : 0));
    }
  }
}

// Partial offload (offload_optimizer.ratio) with frozen units: their master slices, never
// stepped, go to host memory whenever anything does; the ratio splits the trained units.
TEST_CASE("partial offload: frozen units to host memory, the ratio over the trained units") {
  // Four modules of 64 elements; m1 frozen. Stage 3, one rank: a unit per module.
  std::vector<ParamSpec> params = {{"m0.w", {8, 8}, {0}, false},
                                   {"m1.w", {8, 8}, {1}, false},
                                   {"m2.w", {8, 8}, {2}, false},
                                   {"m3.w", {8, 8}, {3}, false}};
  params[1].frozen = true;
  const PartitionPlan plan = plan_of(params, 3, 4);
  const int frozen = plan.module_units(1)[0];
  REQUIRE(plan.unit(frozen).frozen);
  const auto on_host = [&](double ratio) {
    std::vector<int> modules;
    const std::vector<bool> offloaded = UnitSchedule::offloaded_units(plan, ratio);
    for (int m = 0; m < 4; ++m) {
      if (offloaded[static_cast<std::size_t>(plan.module_units(m)[0])]) modules.push_back(m);
    }
    return modules;
  };
  CHECK(on_host(0.0).empty());
  // A third of the trained elements: the last module's unit; two thirds: the last two trained.
  CHECK(on_host(0.3) == std::vector<int>{1, 3});
  CHECK(on_host(0.5) == std::vector<int>{1, 2, 3});
  CHECK(on_host(1.0) == std::vector<int>{0, 1, 2, 3});
}

// Frozen lower modules (model.frozen on the embedding and the first layers): a model that stops
// its backward early ends it at the lowest module with a trained parameter, and the schedule
// ends the micro-batch there: nothing below is gathered, kept, prefetched or given a secondary
// shard for a backward that will not come, and a tied frozen unit's last backward use is the
// highest of its modules the backward reaches.
TEST_CASE("a backward that ends at the lowest module with a trained parameter") {
  // e: a frozen table tied between modules 0 and 3; m1 frozen; m2 and m3 trained.
  std::vector<ParamSpec> params = {{"e", {8, 8}, {0, 3}, false},
                                   {"m1.w", {8, 8}, {1}, false},
                                   {"m2.w", {8, 8}, {2}, false},
                                   {"m3.w", {8, 8}, {3}, false}};
  params[0].frozen = params[1].frozen = true;
  PartitionOptions po;
  po.stage = 3;
  po.world = 4;
  po.persistence_threshold = 0;
  po.alignment = 4;
  po.num_modules = 4;
  const PartitionPlan plan(params, po);
  CHECK(UnitSchedule::lowest_trained_module(plan, 4) == 2);
  {
    std::vector<ParamSpec> all = params;
    for (ParamSpec& p : all) p.frozen = false;
    CHECK(UnitSchedule::lowest_trained_module(PartitionPlan(all, po), 4) == 0);
    for (ParamSpec& p : all) p.frozen = true;  // the last module's backward still runs
    CHECK(UnitSchedule::lowest_trained_module(PartitionPlan(all, po), 4) == 3);
  }
  const int ue = plan.placement(0).unit, u1 = plan.module_units(1)[0], u2 = plan.module_units(2)[0];
  ScheduleOptions o;
  o.stage = 3;
  o.stage3_prefetch_bucket_size = 0;
  o.hpz_partition_size = 2;
  o.first_backward_module = 3;  // above m2's trained parameter: its gradient would be lost
  CHECK_THROWS_WITH(UnitSchedule(plan, 4, o),
                    Catch::Contains("the backward must reach module 2, the lowest with a trained"));
  o.first_backward_module = 2;
  using V = std::vector<UnitOp>;
  SECTION("stage 3 with hpZ: the micro-batch ends at module 2") {
    UnitSchedule s(plan, 4, o);
    // The tied table keeps a secondary shard (module 3's backward reads it), m1 none.
    CHECK(show(s.acquire(0, Phase::kForward)) ==
          show(V{{K::kIssueGather, ue}, {K::kKeepSecondary, ue}, {K::kAwaitGather, ue}}));
    s.release(0, Phase::kForward);
    CHECK(show(s.acquire(1, Phase::kForward)) ==
          show(V{{K::kIssueGather, u1}, {K::kAwaitGather, u1}}));
    CHECK(show(s.release(1, Phase::kForward)) == show(V{{K::kReleaseGather, u1}}));
    for (int m : {2, 3}) {
      s.acquire(m, Phase::kForward);
      s.release(m, Phase::kForward);
    }
    for (int m : {3, 2}) {
      for (const UnitOp& op : s.acquire(m, Phase::kBackward)) {
        if (op.kind == K::kFreeSecondary && op.unit == ue) CHECK(m == 3);
      }
      const std::vector<UnitOp> ops = s.release(m, Phase::kBackward);
      if (m == 2) {
        // No gather for module 1, and every bucket goes: m2's after its reduction.
        CHECK(show(ops) ==
              show(V{{K::kReleaseGather, u2}, {K::kIssueReduce, u2, true}, {K::kFreeBucket, u2}}));
      }
    }
    CHECK(s.micro_batch() == 1);
    CHECK(s.live_gathered_elements() == 0);
    CHECK(s.live_secondary_elements() == 0);
    CHECK(s.live_bucket_elements() == 0);
    CHECK_THROWS_WITH(s.acquire(1, Phase::kBackward),
                      Catch::Contains("backward of module 1: the backward ends at module 2"));
    CHECK_THROWS_WITH(s.acquire(1, Phase::kRecompute),
                      Catch::Contains("recompute of module 1: the backward ends at module 2"));
    s.step();
  }
  SECTION("stage 3: a forward keeps nothing below for a backward, nor prefetches it") {
    o.hpz_partition_size = 0;
    o.stage3_max_reuse_distance = 1000;  // everything would be kept
    o.stage3_prefetch_bucket_size = 1000;
    UnitSchedule s(plan, 4, o);
    for (int m = 0; m < 4; ++m) {
      s.acquire(m, Phase::kForward);
      const std::vector<UnitOp> ops = s.release(m, Phase::kForward);
      if (m == 1) CHECK(show(ops) == show(V{{K::kReleaseGather, u1}}));
    }
    CHECK_FALSE(s.gathered(u1));
    for (int m : {3, 2}) {
      for (const UnitOp& op : s.acquire(m, Phase::kBackward)) CHECK(op.unit != u1);
      for (const UnitOp& op : s.release(m, Phase::kBackward)) CHECK(op.unit != u1);
    }
    CHECK(s.live_gathered_elements() == 0);
  }
  SECTION("stage 2: the tied frozen bucket goes after module 3, the rest at module 2") {
    const PartitionPlan plan2 = bucket_plan(params, po, 2);
    ScheduleOptions o2;
    o2.stage = 2;
    o2.first_backward_module = 2;
    UnitSchedule s(plan2, 4, o2);
    forward_pass(s, 4);
    s.acquire(3, Phase::kBackward);
    const int e2 = plan2.placement(0).unit;
    CHECK(s.bucket_open(e2));
    s.release(3, Phase::kBackward);
    CHECK_FALSE(s.bucket_open(e2));
    s.acquire(2, Phase::kBackward);
    s.release(2, Phase::kBackward);
    CHECK(s.live_bucket_elements() == 0);
    CHECK(s.micro_batch() == 1);
  }
  SECTION("stage 1 over two micro-batches: each trained unit reduced once, in the last") {
    const PartitionPlan plan1 = bucket_plan(params, po, 1);
    ScheduleOptions o1;
    o1.stage = 1;
    o1.gradient_accumulation_steps = 2;
    o1.first_backward_module = 2;
    UnitSchedule s(plan1, 4, o1);
    const int e1 = plan1.placement(0).unit;
    for (int step = 0; step < 2; ++step) {
      for (int micro = 0; micro < 2; ++micro) {
        forward_pass(s, 4);
        std::vector<int> reduced;
        for (int m : {3, 2}) {
          // Trained units accumulate in the full gradients: only the tied frozen table gets a
          // bucket, for module 3's backward, freed after it.
          for (const UnitOp& op : s.acquire(m, Phase::kBackward)) {
            CHECK(show({op}) == show({{K::kOpenBucket, e1}}));
            CHECK(m == 3);
          }
          if (m == 3) CHECK(s.bucket_open(e1));
          for (const UnitOp& op : s.release(m, Phase::kBackward)) {
            if (op.kind == K::kFreeBucket) CHECK((op.unit == e1 && m == 3));
            if (op.kind != K::kIssueReduce) continue;
            CHECK(op.final);
            CHECK_FALSE(plan1.unit(op.unit).frozen);
            reduced.push_back(op.unit);
          }
        }
        CHECK(s.micro_batch() == micro + 1);
        CHECK(s.live_bucket_elements() == 0);
        if (micro == 0) {
          CHECK(reduced.empty());
        } else {
          CHECK(reduced == std::vector<int>{plan1.module_units(3)[0], plan1.module_units(2)[0]});
        }
      }
      s.step();
      CHECK(s.micro_batch() == 0);
    }
  }
  SECTION("zrt-mem's replay ends there too") {
    // The replay's step() would throw on a secondary shard left for a backward that never came.
    const std::vector<bool> recomputed = {false, true, true, false};
    const SchedulePeaks peaks = schedule_peaks(plan, 4, o, recomputed);
    // The largest moment: m3's and the tied table's gathered units (64 each) at the turn.
    CHECK(peaks.gathered_elements == 128);
  }
}

TEST_CASE("hpZ: keep a secondary shard after the first gather, gather from it later, free it") {
  const auto params = chain();
  PartitionOptions po;
  po.stage = 3;
  po.world = 4;
  po.persistence_threshold = 0;
  po.alignment = 4;
  po.num_modules = 3;
  const PartitionPlan plan(params, po);
  const int u0 = plan.module_units(0)[0], u1 = plan.module_units(1)[0],
            u2 = plan.module_units(2)[0];
  ScheduleOptions o;
  o.stage = 3;
  o.stage3_prefetch_bucket_size = 0;
  o.hpz_partition_size = 2;
  UnitSchedule s(plan, 3, o);
  using V = std::vector<UnitOp>;
  CHECK(s.secondary_numel(u0) == 32);
  // Forward: the gathers over every rank, each followed by keeping this rank's half.
  CHECK(show(s.acquire(0, Phase::kForward)) ==
        show(V{{K::kIssueGather, u0}, {K::kKeepSecondary, u0}, {K::kAwaitGather, u0}}));
  s.release(0, Phase::kForward);
  s.acquire(1, Phase::kForward);
  s.release(1, Phase::kForward);
  s.acquire(2, Phase::kForward);
  s.release(2, Phase::kForward);
  CHECK(s.live_secondary_elements() == 96);
  // A training forward without its backward leaves shards of the old parameters: no step().
  CHECK_THROWS_WITH(s.step(), Catch::Contains("step() while hpZ secondary shards are alive"));
  // Backward: the kept unit frees its shard at once; the others gather from theirs first.
  CHECK(show(s.acquire(2, Phase::kBackward)) ==
        show(V{{K::kAwaitGather, u2}, {K::kFreeSecondary, u2}, {K::kOpenBucket, u2}}));
  CHECK(show(s.release(2, Phase::kBackward)) ==
        show(V{
            {K::kReleaseGather, u2}, {K::kIssueSecondaryGather, u1}, {K::kIssueReduce, u2, true}}));
  CHECK(show(s.acquire(1, Phase::kBackward)) == show(V{{K::kAwaitGather, u1},
                                                       {K::kFreeSecondary, u1},
                                                       {K::kFreeBucket, u2},
                                                       {K::kOpenBucket, u1}}));
  s.release(1, Phase::kBackward);
  s.acquire(0, Phase::kBackward);
  s.release(0, Phase::kBackward);
  CHECK(s.live_secondary_elements() == 0);
  s.step();
  // An eval pass gathers over every rank and keeps nothing.
  CHECK(show(s.acquire(0, Phase::kEval)) == show(V{{K::kIssueGather, u0}, {K::kAwaitGather, u0}}));

  // A group that keeps no secondary shards (hpz_group_sizes 0: its units are read in place, an
  // expert unit at full expert parallelism): every training gather is a plain one and keeps
  // nothing, so no backward gathers from shards the engine never made.
  o.hpz_group_sizes = {0};
  UnitSchedule none(plan, 3, o);
  CHECK(none.secondary_numel(u0) == 0);
  CHECK(show(none.acquire(0, Phase::kForward)) ==
        show(V{{K::kIssueGather, u0}, {K::kAwaitGather, u0}}));
  none.release(0, Phase::kForward);
  for (int m : {1, 2}) {
    none.acquire(m, Phase::kForward);
    none.release(m, Phase::kForward);
  }
  CHECK(none.live_secondary_elements() == 0);
  CHECK(show(none.acquire(2, Phase::kBackward)) ==
        show(V{{K::kAwaitGather, u2}, {K::kOpenBucket, u2}}));
  CHECK(show(none.release(2, Phase::kBackward)) ==
        show(V{{K::kReleaseGather, u2}, {K::kIssueGather, u1}, {K::kIssueReduce, u2, true}}));
  CHECK(schedule_peaks(plan, 3, o, {false, false, false}).secondary_elements == 0);
  o.hpz_group_sizes = {};
  CHECK(schedule_peaks(plan, 3, o, {false, false, false}).secondary_elements == 96);
}

TEST_CASE("stage 3 prefetch is a window of the budget over the next uses") {
  // Four 64-element modules, two units of budget: the window ahead holds two units, and units
  // already gathered for those uses take their place in it, so it never runs further ahead.
  const std::vector<ParamSpec> params = {{"m0.w", {8, 8}, {0}, false},
                                         {"m1.w", {8, 8}, {1}, false},
                                         {"m2.w", {8, 8}, {2}, false},
                                         {"m3.w", {8, 8}, {3}, false}};
  const PartitionPlan plan = plan_of(params, 3, 4);
  const std::int64_t n = plan.unit(0).numel;
  auto u = [&](int m) { return plan.module_units(m)[0]; };
  using V = std::vector<UnitOp>;
  ScheduleOptions o;
  o.stage = 3;
  o.stage3_prefetch_bucket_size = 2 * n;
  UnitSchedule s(plan, 4, o);
  CHECK(show(s.acquire(0, Phase::kForward)) == show(V{{K::kIssueGather, u(0)},
                                                      {K::kAwaitGather, u(0)},
                                                      {K::kIssueGather, u(1)},
                                                      {K::kIssueGather, u(2)}}));
  s.release(0, Phase::kForward);
  // Units 1 and 2 are the window of module 1: module 2's unit is gathered, module 3's is next.
  CHECK(show(s.acquire(1, Phase::kForward)) ==
        show(V{{K::kAwaitGather, u(1)}, {K::kIssueGather, u(3)}}));
  s.release(1, Phase::kForward);
  // Module 2: the next uses are module 3's forward and backward (unit 3, gathered) and module
  // 2's own backward (unit 2, in use): the window is full, and unit 1 (module 1's backward,
  // released after its forward) waits. The old per-call budget gathered it here, and unit 0
  // at module 3: the whole backward's units during the forward.
  CHECK(show(s.acquire(2, Phase::kForward)) == show(V{{K::kAwaitGather, u(2)}}));
  CHECK(s.live_gathered_elements() == 2 * n);
  s.release(2, Phase::kForward);
  // Module 3 (the last, kept for its backward): its backward and module 2's (unit 2, released
  // after its forward) are next: unit 2 comes back.
  CHECK(show(s.acquire(3, Phase::kForward)) ==
        show(V{{K::kAwaitGather, u(3)}, {K::kIssueGather, u(2)}}));
}

TEST_CASE("stage 3 prefetch stops at the budget and at the live-parameter bound") {
  const auto params = chain();
  const PartitionPlan plan = plan_of(params, 3, 3);
  const std::int64_t n = plan.unit(0).numel;
  const int u0 = plan.module_units(0)[0], u1 = plan.module_units(1)[0],
            u2 = plan.module_units(2)[0];
  using V = std::vector<UnitOp>;
  {
    ScheduleOptions o;
    o.stage = 3;
    o.stage3_prefetch_bucket_size = n;  // one unit ahead
    UnitSchedule s(plan, 3, o);
    CHECK(show(s.acquire(0, Phase::kForward)) ==
          show(V{{K::kIssueGather, u0}, {K::kAwaitGather, u0}, {K::kIssueGather, u1}}));
    s.release(0, Phase::kForward);
    CHECK(show(s.acquire(1, Phase::kForward)) ==
          show(V{{K::kAwaitGather, u1}, {K::kIssueGather, u2}}));
  }
  {
    ScheduleOptions o;
    o.stage = 3;
    o.stage3_prefetch_bucket_size = 10 * n;
    o.stage3_max_live_parameters = 2 * n;  // the module's own unit and one more
    UnitSchedule s(plan, 3, o);
    CHECK(show(s.acquire(0, Phase::kForward)) ==
          show(V{{K::kIssueGather, u0}, {K::kAwaitGather, u0}, {K::kIssueGather, u1}}));
    CHECK(s.live_gathered_elements() == 2 * n);
  }
}

TEST_CASE("stages 0-2: when each unit's gradient is reduced over accumulation") {
  const auto params = chain();
  for (int stage : {0, 1, 2}) {
    const PartitionPlan plan = plan_of(params, stage, 3);
    ScheduleOptions o;
    o.stage = stage;
    o.gradient_accumulation_steps = 2;
    UnitSchedule s(plan, 3, o);
    std::vector<std::vector<UnitOp>> reductions;  // per micro-batch
    for (int micro = 0; micro < 2; ++micro) {
      std::vector<UnitOp> reduced;
      for (int m = 2; m >= 0; --m) {
        for (const UnitOp& op : s.acquire(m, Phase::kBackward)) {
          CHECK((op.kind == K::kOpenBucket || op.kind == K::kFreeBucket));
          CHECK(stage == 2);  // only stage 2 (and 3) has buckets
        }
        for (const UnitOp& op : s.release(m, Phase::kBackward)) {
          if (op.kind == K::kIssueReduce) reduced.push_back(op);
        }
      }
      reductions.push_back(reduced);
    }
    INFO("stage " << stage);
    // Stage 2 reduces every micro-batch (final only in the last); stages 0-1 once, at the end.
    CHECK(reductions[0].size() == (stage == 2 ? 3u : 0u));
    REQUIRE(reductions[1].size() == 3u);
    for (const UnitOp& op : reductions[1]) CHECK(op.final);
    for (const UnitOp& op : reductions[0]) CHECK_FALSE(op.final);
  }
}

TEST_CASE("schedule peaks: gathered units and buckets as worked out by hand") {
  const auto params = chain();
  const PartitionPlan plan = plan_of(params, 3, 3);
  const std::int64_t n = plan.unit(0).numel;
  ScheduleOptions o;
  o.stage = 3;
  o.stage3_prefetch_bucket_size = 0;
  // Without prefetch one unit is gathered at a time and one bucket lives at a time, together
  // during a backward: n, n, 2n.
  SchedulePeaks p = schedule_peaks(plan, 3, o, {false, false, false});
  CHECK(p.gathered_elements == n);
  CHECK(p.bucket_elements == n);
  CHECK(p.sum_elements == 2 * n);
  // In bytes, each at its own size (zrt-mem: bf16 parameters beside an fp32 frozen unit's
  // bucket): 2n + 4n at the backward's peak, not 2n elements of either size.
  CHECK(schedule_peaks(plan, 3, o, {false, false, false}, {}, ElementBytes{2, 4}).sum_bytes ==
        6 * n);
  CHECK(p.sum_bytes == p.sum_elements);  // one byte each by default
  // One unit of prefetch: the forward of module 2 holds unit 2 and prefetches unit 1 (the next
  // use in the static order is module 1's backward); in the backward of module 2 unit 1 still
  // fills the one-unit window, so unit 0 waits: 2n, and the bucket on top: 3n.
  o.stage3_prefetch_bucket_size = n;
  p = schedule_peaks(plan, 3, o, {false, false, false});
  CHECK(p.gathered_elements == 2 * n);
  CHECK(p.bucket_elements == n);
  CHECK(p.sum_elements == 3 * n);
  // Two units of prefetch: the backward of module 2 also gathers unit 0: all three units, 3n,
  // and the bucket: 4n.
  o.stage3_prefetch_bucket_size = 2 * n;
  p = schedule_peaks(plan, 3, o, {false, false, false});
  CHECK(p.gathered_elements == 3 * n);
  CHECK(p.sum_elements == 4 * n);
  // The live-parameter bound caps it: two units at most, so the peak with a bucket is 3n.
  o.stage3_max_live_parameters = 2 * n;
  p = schedule_peaks(plan, 3, o, {false, false, false});
  CHECK(p.gathered_elements == 2 * n);
  CHECK(p.sum_elements == 3 * n);
  // The recompute of module 1 (activation checkpointing) uses a unit already held.
  CHECK(schedule_peaks(plan, 3, o, {false, true, false}).gathered_elements == 2 * n);
  CHECK_THROWS_WITH(schedule_peaks(plan, 3, o, {false}),
                    Catch::Contains("1 recompute flags for 3 modules"));
}

TEST_CASE("stage 3 reuse distance: a forward keeps the units its backward needs soon") {
  // Three 64-element modules: between module 1's forward and its backward come module 2's
  // forward and backward (128 elements); between module 0's, modules 1 and 2 twice (256).
  const auto params = chain();
  const PartitionPlan plan = plan_of(params, 3, 3);
  const int u0 = plan.module_units(0)[0], u1 = plan.module_units(1)[0],
            u2 = plan.module_units(2)[0];
  using V = std::vector<UnitOp>;
  auto schedule_with = [&](std::int64_t distance, std::int64_t max_live) {
    ScheduleOptions o;
    o.stage = 3;
    o.stage3_prefetch_bucket_size = 0;
    o.stage3_max_reuse_distance = distance;
    o.stage3_max_live_parameters = max_live;
    return UnitSchedule(plan, 3, o);
  };
  SECTION("within the distance: module 1 stays gathered and its backward gathers nothing") {
    UnitSchedule s = schedule_with(128, 1000);
    s.acquire(0, Phase::kForward);
    CHECK(show(s.release(0, Phase::kForward)) == show(V{{K::kReleaseGather, u0}}));
    s.acquire(1, Phase::kForward);
    CHECK(s.release(1, Phase::kForward).empty());
    s.acquire(2, Phase::kForward);
    CHECK(s.live_gathered_elements() == 128);  // u1 and u2
    CHECK(s.release(2, Phase::kForward).empty());
    s.acquire(2, Phase::kBackward);
    // u1, kept from the forward, needs no gather; u0's goes ahead of u1's reduction.
    CHECK(show(s.release(2, Phase::kBackward)) ==
          show(V{{K::kReleaseGather, u2}, {K::kIssueReduce, u2, true}}));
    CHECK(show(s.acquire(1, Phase::kBackward)) ==
          show(V{{K::kAwaitGather, u1}, {K::kFreeBucket, u2}, {K::kOpenBucket, u1}}));
    CHECK(show(s.release(1, Phase::kBackward)) ==
          show(V{{K::kReleaseGather, u1}, {K::kIssueGather, u0}, {K::kIssueReduce, u1, true}}));
    CHECK(show(s.acquire(0, Phase::kBackward)) ==
          show(V{{K::kAwaitGather, u0}, {K::kFreeBucket, u1}, {K::kOpenBucket, u0}}));
    s.release(0, Phase::kBackward);
    CHECK(s.live_gathered_elements() == 0);
    // An eval forward has no backward: it keeps nothing whatever the distance.
    s.step();
    s.acquire(0, Phase::kEval);
    s.release(0, Phase::kEval);
    s.acquire(1, Phase::kEval);
    CHECK(show(s.release(1, Phase::kEval)) == show(V{{K::kReleaseGather, u1}}));
  }
  SECTION("one element short of the distance, or over the live bound: released as before") {
    for (auto [distance, max_live] :
         {std::pair<std::int64_t, std::int64_t>{127, 1000}, {128, 63}}) {
      UnitSchedule s = schedule_with(distance, max_live);
      s.acquire(0, Phase::kForward);
      s.release(0, Phase::kForward);
      s.acquire(1, Phase::kForward);
      CHECK(show(s.release(1, Phase::kForward)) == show(V{{K::kReleaseGather, u1}}));
    }
  }
  SECTION("everything within the distance: no backward gathers, all parameters live at the turn") {
    UnitSchedule s = schedule_with(256, 1000);
    for (int m = 0; m < 3; ++m) {
      s.acquire(m, Phase::kForward);
      CHECK(s.release(m, Phase::kForward).empty());
    }
    CHECK(s.live_gathered_elements() == 192);
    for (int m = 2; m >= 0; --m) {
      for (const UnitOp& op : s.acquire(m, Phase::kBackward)) CHECK(op.kind != K::kIssueGather);
      s.release(m, Phase::kBackward);
    }
    CHECK(s.live_gathered_elements() == 0);
  }
  SECTION("zrt-mem's peaks follow the kept units") {
    ScheduleOptions o;
    o.stage = 3;
    o.stage3_prefetch_bucket_size = 0;
    const std::vector<bool> no_recompute(3, false);
    CHECK(schedule_peaks(plan, 3, o, no_recompute).gathered_elements == 64);
    o.stage3_max_reuse_distance = 128;
    CHECK(schedule_peaks(plan, 3, o, no_recompute).gathered_elements == 128);
    o.stage3_max_reuse_distance = 256;
    CHECK(schedule_peaks(plan, 3, o, no_recompute).gathered_elements == 192);
  }
}
