// Hierarchical sharding (MiCS; HSDP at stage 2): the state sliced over shard groups of S
// consecutive ranks and replicated across the N / S groups. At N = 4 (2 groups x 2) and N = 8
// (2 x 4, 4 x 2), stages 1-3, with and without accumulation and optimizer offload, the
// parameters equal the single-process reference within the tolerance test_engine_parity uses
// for plain sharding; the reported norm is the true one; and with a shard group per node only
// the replica all-reduce of each gradient slice crosses nodes: the inter-node bytes per step
// equal that formula exactly, and are a fraction of plain sharding's.
#include <catch2/catch.hpp>

#include <mpi.h>

#include <set>

#include "tests/engine/engine_test_util.h"

using namespace zrt;
using namespace zrt::test;

namespace {

EngineOptions engine_options(int stage, int accumulation, bool offload) {
  EngineOptions o = test_engine_options(stage, accumulation);
  o.offload_optimizer.enabled = offload;
  return o;
}

std::vector<int> shard_sizes(int world) {
  // Across real hosts: a shard group per host (the inter-node test below relies on it).
  if (nodes_from_mpi()) return {test_topology(0).ranks_per_node()};
  std::set<int> sizes;
  if (world % 2 == 0 && world >= 4) sizes.insert(2);
  if (world % 2 == 0 && world / 2 >= 2) sizes.insert(world / 2);
  return {sizes.begin(), sizes.end()};
}

std::int64_t inter_bytes(const EngineRun& run) {
  return run.group->stats().snapshot().total_inter_bytes() +
         run.shards->stats().snapshot().total_inter_bytes() +
         run.replicas->stats().snapshot().total_inter_bytes();
}

}  // namespace

TEST_CASE("MiCS / HSDP: every stage equals the single-process reference") {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (shard_sizes(world).empty()) {
    WARN("hierarchical sharding needs 4 or more ranks (an even number); world " << world);
    return;
  }
  for (int accumulation : {1, 3}) {
    TrainSpec spec;
    spec.steps = 6;
    spec.accumulation = accumulation;
    spec.clip = 0.05;
    std::vector<double> reference_norms;
    const auto reference = train_reference(spec, world, &reference_norms);
    for (int shard : shard_sizes(world)) {
      spec.shard_size = shard;
      for (int stage = 1; stage <= 3; ++stage) {
        for (bool offload : {false, true}) {
          auto run = make_engine(engine_options(stage, accumulation, offload), spec);
          REQUIRE(run->engine->plan().world() == shard);
          const auto got = train_engine(*run, spec);
          for (std::size_t p = 0; p < got.size(); ++p) {
            INFO("world " << world << " shard " << shard << " stage " << stage << " accumulation "
                          << accumulation << " offload " << offload << " parameter "
                          << run->model.parameters()[p].name);
            CHECK(relative_l2(got[p], reference[p]) <= 1e-6);
          }
          for (std::size_t i = 0; i < run->results.size(); ++i) {
            CHECK(run->results[i].grad_norm == Approx(reference_norms[i]).epsilon(1e-5));
          }
        }
      }
    }
  }
}

TEST_CASE("MiCS: only each gradient slice's replica average crosses nodes") {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (shard_sizes(world).empty()) {
    WARN("hierarchical sharding needs 4 or more ranks (an even number); world " << world);
    return;
  }
  for (int shard : shard_sizes(world)) {
    for (int stage = 1; stage <= 3; ++stage) {
      const int accumulation = 2;
      TrainSpec spec;
      spec.steps = 2;
      spec.accumulation = accumulation;
      spec.shard_size = shard;
      auto run = make_engine(engine_options(stage, accumulation, false), spec);
      const std::int64_t before = inter_bytes(*run);
      train_engine(*run, spec);
      const std::int64_t per_step = (inter_bytes(*run) - before) / spec.steps;
      // Shard groups are nodes, so the gathers, reduce-scatters and the norm's all-reduce stay
      // inside; the replica all-reduce of each unit's slice (fp32, zero-padded to R slices, sent
      // as a reduce-scatter and an all-gather: 2 blocks) is all that leaves: once per
      // micro-batch at stages 2-3, once per step at stage 1.
      const int replicas = world / shard;
      std::int64_t expected = 0;
      for (const Unit& unit : run->engine->plan().units()) {
        const std::int64_t block = (unit.shard + replicas - 1) / replicas;
        expected += 2 * (replicas - 1) * block * 4;
      }
      if (stage >= 2) expected *= accumulation;
      INFO("world " << world << " shard " << shard << " stage " << stage);
      CHECK(per_step == expected);
      CHECK(run->shards->stats().snapshot().total_inter_bytes() == 0);
      CHECK(run->replicas->stats().snapshot().total_intra_bytes() == 0);

      // Plain sharding over the same nodes sends more across them.
      TrainSpec flat_spec = spec;
      flat_spec.shard_size = 0;
      auto flat = make_engine(engine_options(stage, accumulation, false), flat_spec);
      if (!nodes_from_mpi()) flat->group->set_node_map(NodeTopology(world, shard).node_map());
      const std::int64_t flat_before = flat->group->stats().snapshot().total_inter_bytes();
      train_engine(*flat, flat_spec);
      const std::int64_t flat_per_step =
          (flat->group->stats().snapshot().total_inter_bytes() - flat_before) / spec.steps;
      CHECK(flat_per_step > per_step);
      WARN("world " << world << " shard " << shard << " stage " << stage
                    << ": inter-node bytes per step per rank " << per_step << " (plain sharding "
                    << flat_per_step << ")");
    }
  }
}
