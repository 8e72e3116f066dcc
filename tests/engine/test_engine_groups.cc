// Units that know their group: TiedMlp's parameters split between the engine's shard group 0
// (every rank) and group 1 (sharded over S = N/2 consecutive ranks, replicated over the N/S
// blocks, like MiCS for those parameters only). At stages 1-3, with and without accumulation and
// optimizer offload, each step's loss and gradient norm and the final parameters equal the
// single-process reference within the tolerances test_engine_mics uses; the group-1 units are
// sliced by their own group (plan, slice ranks, traffic on the group's communicators); and
// options the groups do not support are refused. The partition over groups is checked pure.
// (Checkpoints of several groups: test_engine_groups_checkpoint.cc.)
#include <catch2/catch.hpp>

#include <mpi.h>

#include <set>
#include <string>

#include "tests/engine/engine_test_util.h"

using namespace zrt;
using namespace zrt::test;

namespace {

// Which parameters go to group 1: the first layer and the output bias (dense weights, a
// persistent bias at stage 3), or the tied embedding and the second layer's weight (a shared
// unit, a module split between two groups).
const std::vector<std::set<std::string>>& group1_choices() {
  static const std::vector<std::set<std::string>> choices{{"fc1.weight", "fc1.bias", "out.bias"},
                                                          {"embed.weight", "fc2.weight"}};
  return choices;
}

std::vector<ParamSpec> grouped_params(const std::set<std::string>& group1) {
  std::vector<ParamSpec> params = TiedMlp(kD, kH).parameters();
  for (ParamSpec& p : params) p.group = group1.count(p.name) != 0 ? 1 : 0;
  return params;
}

// An engine over two groups: [0] every rank, [1] blocks of `shard` consecutive ranks with the
// replica group across them. Reuses EngineRun: `group` the world, `shards` / `replicas` group 1's.
std::unique_ptr<EngineRun> make_grouped_engine(const EngineOptions& options, const TrainSpec& spec,
                                               int shard, const std::vector<ParamSpec>& params) {
  auto run = std::make_unique<EngineRun>();
  run->device = make_device(DeviceOptions{});
  run->compute = run->device->create_stream("compute");
  run->comm = run->device->create_stream("comm");
  run->group = make_process_group(*run->device, MPI_COMM_WORLD, *run->comm, "engine", {});
  const int world = run->group->size(), rank = run->group->rank();
  run->shards = make_subgroup(*run->group, shard_plan(world, shard, rank), *run->comm,
                              "engine-group1-shards");
  run->replicas = make_subgroup(*run->group, replica_plan(world, shard, rank), *run->comm,
                                "engine-group1-replicas");
  AdamOptions adam;
  adam.lr = spec.lr;
  adam.weight_decay = spec.weight_decay;
  run->optimizer = make_device_adam(*run->device, adam);
  std::vector<ShardGroup> groups{ShardGroup{run->group.get()},
                                 ShardGroup{run->shards.get(), run->replicas.get()}};
  run->engine = std::make_unique<ZeroEngine>(*run->device, *run->compute, std::move(groups), params,
                                             run->model.modules(), options, *run->optimizer,
                                             make_cpu_optimizer_offload);
  run->engine->initialize([](int p, std::int64_t first, std::int64_t count, float* out) {
    for (std::int64_t i = 0; i < count; ++i) out[i] = TiedMlp::init_value(p, first + i);
  });
  return run;
}

// train_one_step's step with the loss kept: the mean over this step's micro-batches and ranks.
double train_step_with_loss(EngineRun& run, const TrainSpec& spec, int step) {
  const int rank = run.group->rank();
  const int world = run.group->size();
  std::vector<std::vector<float>> keep;
  std::vector<float> losses(static_cast<std::size_t>(spec.accumulation), 0.f);
  for (int g = 0; g < spec.accumulation; ++g) {
    const std::int64_t first = (static_cast<std::int64_t>(g) * world + rank) * kRows;
    keep.push_back(batch(step, first, kRows, 0, run.model.d()));
    keep.push_back(batch(step, first, kRows, 1, run.model.d()));
    run.model.forward_backward(*run.engine, *run.compute, keep[keep.size() - 2].data(),
                               keep.back().data(), kRows, run.engine->loss_scale(),
                               &losses[static_cast<std::size_t>(g)]);
  }
  run.results.push_back(run.engine->step(spec.lr));
  run.compute->synchronize();
  double local = 0.0;
  for (float l : losses) local += l;
  double sum = 0.0;
  MPI_Allreduce(&local, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return sum / (static_cast<double>(world) * spec.accumulation);
}

}  // namespace

TEST_CASE("the partition slices each unit by its own group's world") {
  const auto params = grouped_params(group1_choices()[0]);
  for (int stage = 1; stage <= 3; ++stage) {
    const PartitionOptions o{stage, 4, 600, stage == 3 ? 30 : 0, 8, TiedMlp(kD, kH).modules()};
    const PartitionPlan plan(params, o, {4, 2});
    INFO("stage " << stage << ": " << plan.describe());
    CHECK(plan.group_count() == 2);
    CHECK(plan.world() == 4);
    std::int64_t shards = 0;
    std::set<int> groups_seen;
    for (const Unit& unit : plan.units()) {
      groups_seen.insert(unit.group);
      for (int p : unit.params) CHECK(params[static_cast<std::size_t>(p)].group == unit.group);
      CHECK(unit.numel % (8 * plan.group_world(unit.group)) == 0);
      CHECK(unit.shard * plan.group_world(unit.group) == unit.numel);
      shards += unit.shard;
    }
    CHECK(groups_seen == std::set<int>{0, 1});
    CHECK(plan.total_shard() == shards);
    // Every element of every parameter is owned by exactly one rank of its group.
    for (std::size_t p = 0; p < params.size(); ++p) {
      const int world = plan.group_world(params[p].group);
      std::int64_t owned = 0;
      for (int r = 0; r < world; ++r) owned += plan.owned_range(static_cast<int>(p), r).count;
      CHECK(owned == params[p].numel());
    }
    // With every parameter in group 0 the plan is the one-group plan, unit for unit.
    const auto dense = TiedMlp(kD, kH).parameters();
    const PartitionPlan a(dense, o);
    const PartitionPlan b(dense, o, {4, 2});
    REQUIRE(a.units().size() == b.units().size());
    for (std::size_t u = 0; u < a.units().size(); ++u) {
      CHECK(a.units()[u].params == b.units()[u].params);
      CHECK(a.units()[u].numel == b.units()[u].numel);
      CHECK(a.units()[u].shard == b.units()[u].shard);
    }
  }
  auto bad = params;
  bad[0].group = 2;
  CHECK_THROWS_WITH(
      PartitionPlan(bad, PartitionOptions{1, 4, 600, 0, 8, TiedMlp(kD, kH).modules()}, {4, 2}),
      Catch::Contains("parameter 'embed.weight' names shard group 2 but the engine has 2"));
}

TEST_CASE("units over two groups: every stage equals the single-process reference") {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world % 2 != 0) {
    WARN("two groups need an even number of ranks; world " << world);
    return;
  }
  const int shard = world / 2;
  for (int accumulation : {1, 3}) {
    TrainSpec spec;
    spec.steps = 6;
    spec.accumulation = accumulation;
    spec.clip = 0.05;
    std::vector<double> reference_norms, reference_losses;
    const auto reference = train_reference(spec, world, &reference_norms, &reference_losses);
    for (const auto& group1 : group1_choices()) {
      const auto params = grouped_params(group1);
      for (int stage = 1; stage <= 3; ++stage) {
        for (bool offload : {false, true}) {
          EngineOptions options = test_engine_options(stage, accumulation);
          options.offload_optimizer.enabled = offload;
          auto run = make_grouped_engine(options, spec, shard, params);
          const ZeroEngine& engine = *run->engine;
          INFO("world " << world << " stage " << stage << " accumulation " << accumulation
                        << " offload " << offload << " group 1: " << *group1.begin() << "...; "
                        << engine.plan().describe());
          // Group 1's units are sliced over its shard group, the rest over every rank.
          REQUIRE(engine.plan().group_count() == 2);
          for (std::size_t u = 0; u < engine.plan().units().size(); ++u) {
            const Unit& unit = engine.plan().unit(static_cast<int>(u));
            const int expected_world = unit.group == 1 ? shard : world;
            CHECK(unit.shard * expected_world == unit.numel);
            CHECK(engine.slice_rank(static_cast<int>(u)) ==
                  (unit.group == 1 ? run->group->rank() % shard : run->group->rank()));
          }
          const std::int64_t replica_bytes = run->replicas->stats().snapshot().total_bytes();
          std::vector<double> losses;
          for (int step = 0; step < spec.steps; ++step) {
            losses.push_back(train_step_with_loss(*run, spec, step));
          }
          // Group 1's gradients were averaged over its replicas.
          CHECK(run->replicas->stats().snapshot().total_bytes() > replica_bytes);
          for (std::size_t p = 0; p < params.size(); ++p) {
            INFO("parameter " << params[p].name << " (group " << params[p].group << ")");
            CHECK(relative_l2(run->engine->full_parameter(static_cast<int>(p)), reference[p]) <=
                  1e-6);
          }
          for (std::size_t i = 0; i < run->results.size(); ++i) {
            INFO("step " << i);
            CHECK(run->results[i].grad_norm == Approx(reference_norms[i]).epsilon(1e-5));
            CHECK(losses[i] == Approx(reference_losses[i]).epsilon(1e-5));
          }
        }
      }
    }
  }
}

TEST_CASE("a multi-group engine refuses unsupported options") {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world % 2 != 0) return;
  TrainSpec spec;
  const auto params = grouped_params(group1_choices()[0]);
  // Stage 0 keeps whole units: a group may not have replicas (its units would be all-reduced
  // over its shard group only).
  CHECK_THROWS_WITH(make_grouped_engine(test_engine_options(0, 1), spec, world / 2, params),
                    Catch::Contains("hierarchical sharding (a replica group) needs ZeRO stage 1"));
  // A parameter naming a group the engine does not have.
  auto stray = params;
  stray[1].group = 5;
  CHECK_THROWS_WITH(make_grouped_engine(test_engine_options(1, 1), spec, world / 2, stray),
                    Catch::Contains("names shard group 5 but the engine has 2 group(s)"));
}
