// ZeRO++ hpZ (EngineOptions::hpz_partition_size): secondary shards of stage 3's gathered
// parameters, kept within groups of S ranks (a node), serve every gather of a unit after its
// first in a micro-batch. At N = 4 (2 nodes x 2) and N = 8 (2 x 4 and 4 x 2, nodes simulated by
// the node map as comm.ranks_per_node does):
// - the parameters equal the single-process reference within test_engine_parity's bound, with
//   and without accumulation and offload;
// - they are bit-identical to plain stage 3 at the same N (the backward computes with exactly
//   the values the forward gathered), also with recompute, qwZ and parameter offload;
// - the inter-node bytes per step equal the formula of docs/multi-node.md exactly, and plain
//   stage 3 sends more by exactly the inter-node share of the gathers hpZ serves from the
//   secondary shards; those stay inside the node, at (S-1) numel/S elements each.
#include <catch2/catch.hpp>

#include <mpi.h>

#include <map>

#include "tests/engine/engine_test_util.h"

using namespace zrt;
using namespace zrt::test;

namespace {

int world_size() {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  return world;
}

// The node sizes tried at this world: 2 nodes x N/2, and N/2 nodes x 2 (one setting at N = 4).
std::vector<int> node_sizes(int world) {
  std::vector<int> sizes;
  if (world >= 4 && world % 2 == 0) sizes.push_back(2);
  if (world >= 8 && world % 2 == 0) sizes.push_back(world / 2);
  return sizes;
}

EngineOptions hpz_options(int hpz, int accumulation, bool offload_optimizer = false,
                          bool offload_param = false) {
  EngineOptions o = test_engine_options(3, accumulation);
  o.hpz_partition_size = hpz;
  o.offload_optimizer.enabled = offload_optimizer || offload_param;
  o.offload_param.enabled = offload_param;
  return o;
}

std::int64_t inter_bytes(const EngineRun& run) {
  std::int64_t bytes = run.group->stats().snapshot().total_inter_bytes();
  if (run.secondary) bytes += run.secondary->stats().snapshot().total_inter_bytes();
  return bytes;
}

}  // namespace

TEST_CASE("hpZ: the single-process reference's parameters, bit-identical to plain stage 3") {
  const int world = world_size();
  if (node_sizes(world).empty()) {
    WARN("hpZ needs 4 or more ranks (an even number) to have two nodes; world " << world);
    return;
  }
  for (int accumulation : {1, 3}) {
    TrainSpec spec;
    spec.steps = 5;
    spec.accumulation = accumulation;
    spec.clip = 0.05;
    std::vector<double> reference_norms;
    const auto reference = train_reference(spec, world, &reference_norms);
    for (int node : node_sizes(world)) {
      spec.ranks_per_node = node;
      for (bool offload : {false, true}) {
        auto plain = make_engine(hpz_options(0, accumulation, offload), spec);
        const auto plain_params = train_engine(*plain, spec);
        auto run = make_engine(hpz_options(node, accumulation, offload), spec);
        REQUIRE(run->secondary->size() == node);
        const auto got = train_engine(*run, spec);
        for (std::size_t p = 0; p < got.size(); ++p) {
          INFO("world " << world << " nodes of " << node << " accumulation " << accumulation
                        << " offload " << offload << " parameter "
                        << run->model.parameters()[p].name);
          CHECK(relative_l2(got[p], reference[p]) <= 1e-6);
          CHECK(got[p] == plain_params[p]);  // bit for bit
        }
        for (std::size_t i = 0; i < run->results.size(); ++i) {
          CHECK(run->results[i].grad_norm == Approx(reference_norms[i]).epsilon(1e-5));
          CHECK(run->results[i].grad_norm == plain->results[i].grad_norm);
        }
      }
    }
  }
}

TEST_CASE("hpZ: bit-identical to stage 3 with recompute, qwZ and parameter offload") {
  const int world = world_size();
  if (node_sizes(world).empty()) {
    WARN("hpZ needs 4 or more ranks (an even number) to have two nodes; world " << world);
    return;
  }
  const int node = node_sizes(world).front();
  struct Variant {
    const char* name;
    bool recompute, quantized_weights, offload_param;
  };
  for (const Variant& v :
       {Variant{"recompute", true, false, false}, Variant{"qwZ", false, true, false},
        Variant{"qwZ + recompute", true, true, false},
        Variant{"parameter offload", false, false, true}}) {
    TrainSpec spec;
    spec.steps = 3;
    spec.accumulation = 2;
    spec.ranks_per_node = node;
    spec.recompute = v.recompute;
    EngineOptions plain_options = hpz_options(0, 2, false, v.offload_param);
    plain_options.quantized_weights = v.quantized_weights;
    EngineOptions options = plain_options;
    options.hpz_partition_size = node;
    auto plain = make_engine(plain_options, spec);
    auto run = make_engine(options, spec);
    const auto want = train_engine(*plain, spec);
    const auto got = train_engine(*run, spec);
    for (std::size_t p = 0; p < got.size(); ++p) {
      INFO(v.name << ", world " << world << ", parameter " << run->model.parameters()[p].name);
      CHECK(got[p] == want[p]);
    }
  }
}

TEST_CASE("hpZ: inter-node bytes per step are the formula; the secondary gathers stay inside") {
  const int world = world_size();
  if (node_sizes(world).empty()) {
    WARN("hpZ needs 4 or more ranks (an even number) to have two nodes; world " << world);
    return;
  }
  for (int node : node_sizes(world)) {
    for (bool recompute : {false, true}) {
      const int accumulation = 2;
      TrainSpec spec;
      spec.steps = 2;
      spec.accumulation = accumulation;
      spec.ranks_per_node = node;
      spec.recompute = recompute;
      auto run = make_engine(hpz_options(node, accumulation), spec);
      auto plain = make_engine(hpz_options(0, accumulation), spec);
      std::vector<std::int64_t> hpz_steps, plain_steps, intra_steps;
      std::int64_t last = inter_bytes(*run);
      std::int64_t last_intra = run->secondary->stats().snapshot().total_intra_bytes();
      train_engine(*run, spec, [&] {
        hpz_steps.push_back(inter_bytes(*run) - last);
        last = inter_bytes(*run);
        const std::int64_t intra = run->secondary->stats().snapshot().total_intra_bytes();
        intra_steps.push_back(intra - last_intra);
        last_intra = intra;
      });
      std::int64_t plain_last = inter_bytes(*plain);
      train_engine(*plain, spec, [&] {
        plain_steps.push_back(inter_bytes(*plain) - plain_last);
        plain_last = inter_bytes(*plain);
      });

      // docs/multi-node.md's formula, per rank and step, e = 4 (fp32), L ranks per node: every
      // unit's first gather of a micro-batch (non-persistent units) and every unit's
      // reduce-scatter send shard elements to each of the N - L ranks on other nodes; once per
      // step the persistent unit is published (all-gather) and the gradient norm all-reduced
      // (one float: 2 x 4 bytes to each other rank).
      const std::int64_t remote = world - node, e = 4;
      std::int64_t per_micro_batch = 0, persistent = 0;
      for (const Unit& unit : run->engine->plan().units()) {
        per_micro_batch += unit.shard * e;                        // reduce-scatter
        if (!unit.persistent) per_micro_batch += unit.shard * e;  // first gather
        if (unit.persistent) persistent += unit.shard * e;
      }
      const std::int64_t expected =
          remote * (accumulation * per_micro_batch + persistent) + remote * 2 * 4;
      // Plain stage 3 gathers each unit this many times per micro-batch over every rank.
      ScheduleOptions plain_schedule = schedule_options(run->engine->options());
      plain_schedule.hpz_partition_size = 0;
      const auto gathers = gathers_per_micro_batch(run->engine->plan(), run->model.modules(),
                                                   recompute, plain_schedule);
      std::int64_t served_inter = 0, served_intra = 0;
      for (const auto& [u, count] : gathers) {
        const Unit& unit = run->engine->plan().unit(u);
        served_inter += (count - 1) * remote * unit.shard * e;
        served_intra += (count - 1) * (node - 1) * (unit.numel / node) * e;
      }
      served_inter *= accumulation;
      served_intra *= accumulation;
      INFO("world " << world << " nodes of " << node << " recompute " << recompute);
      REQUIRE(served_inter > 0);
      for (int s = 0; s < spec.steps; ++s) {
        CHECK(hpz_steps[static_cast<std::size_t>(s)] == expected);
        CHECK(plain_steps[static_cast<std::size_t>(s)] == expected + served_inter);
        CHECK(intra_steps[static_cast<std::size_t>(s)] == served_intra);
      }
      CHECK(run->secondary->stats().snapshot().total_inter_bytes() == 0);
      WARN("world " << world << " nodes of " << node << (recompute ? " recompute" : "")
                    << ": inter-node bytes per step per rank " << hpz_steps.front()
                    << " (plain stage 3 " << plain_steps.front() << ")");
    }
  }
}

TEST_CASE("hpZ: the engine refuses what it does not support, with the fix") {
  const int world = world_size();
  if (node_sizes(world).empty()) {
    WARN("hpZ needs 4 or more ranks (an even number) to have two nodes; world " << world);
    return;
  }
  TrainSpec spec;
  spec.ranks_per_node = 2;
  // Below stage 3 there are no gathered parameters to keep a secondary shard of.
  EngineOptions stage2 = hpz_options(2, 1);
  stage2.stage = 2;
  CHECK_THROWS_WITH(make_engine(stage2, spec),
                    Catch::Contains("zero_optimization.zero_hpz_partition_size: hpZ keeps "
                                    "secondary shards of stage 3's gathered parameters (stage is "
                                    "2); set stage 3 or zero_hpz_partition_size 1"));
  // A group that crosses nodes would send the backward gathers between them.
  TrainSpec wide = spec;
  wide.ranks_per_node = 2;
  CHECK_THROWS_WITH(make_engine(hpz_options(4, 1), wide),
                    Catch::Contains("zero_hpz_partition_size 4: this rank's group of 4 ranks "
                                    "spans nodes") &&
                        Catch::Contains("so the backward gathers would cross nodes"));
  // MiCS keeps the gathers in the shard group already.
  TrainSpec mics = spec;
  mics.shard_size = 2;
  mics.ranks_per_node = 0;
  CHECK_THROWS_WITH(make_engine(hpz_options(2, 1), mics),
                    Catch::Contains("zero_hpz_partition_size with mics_shard_size is not "
                                    "supported"));
}
