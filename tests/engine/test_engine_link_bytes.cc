// The bytes a rank sends per step within its node and to other nodes, for every row of the
// table in docs/multi-node.md ("Expected bytes per step"): stages 1-3 with plain sharding,
// MiCS (a shard group per node), qwZ and qgZ. Each expected figure is the table's formula
// evaluated on the partition plan's unit sizes, the element sizes, the quantization block and
// the node layout (N ranks, R per node, M = N / R nodes), and must equal the counters of every
// group the engine sends through exactly, at every step. Runs on one machine with simulated
// nodes of N / 2 ranks, and across two real hosts (tests/multinode) with the layout from MPI.
#include <catch2/catch.hpp>

#include <mpi.h>

#include <algorithm>

#include "runtime/comm/quantized_collectives.h"
#include "tests/engine/engine_test_util.h"

using namespace zrt;
using namespace zrt::test;

namespace {

constexpr std::int64_t kBlock = 16;  // quantization block: several blocks per slice
constexpr int kMicroBatches = 2;     // G

enum class Row { kPlain, kMics, kQwz, kQgz, kQwzQgz };

const char* row_name(Row row) {
  switch (row) {
    case Row::kPlain:
      return "plain";
    case Row::kMics:
      return "MiCS";
    case Row::kQwz:
      return "qwZ";
    case Row::kQgz:
      return "qgZ";
    case Row::kQwzQgz:
      return "qwZ+qgZ";
  }
  return "?";
}

bool quantizes_weights(Row row) {
  return row == Row::kQwz || row == Row::kQwzQgz;
}
bool quantizes_gradients(Row row) {
  return row == Row::kQgz || row == Row::kQwzQgz;
}

// bf16 compute (e_c = 2) and fp32 communication (e_w = 4): the two sizes differ, so a formula
// that took one for the other fails.
constexpr std::int64_t kComputeBytes = 2;
constexpr std::int64_t kWireBytes = 4;

EngineOptions row_options(Row row, int stage) {
  EngineOptions o = test_engine_options(stage, kMicroBatches);
  o.compute_dtype = DType::kBFloat16;
  o.communication_dtype = DType::kFloat32;
  o.quantized_weights = quantizes_weights(row);
  o.quantized_gradients = quantizes_gradients(row);
  return o;
}

LinkBytes sent_by(const EngineRun& run) {
  LinkBytes sum;
  for (const ProcessGroup* g :
       {run.group.get(), run.shards.get(), run.replicas.get(), run.intra.get(), run.inter.get()}) {
    if (g == nullptr) continue;
    const CommCounts c = g->stats().snapshot();
    sum.intra += c.total_intra_bytes();
    sum.inter += c.total_inter_bytes();
  }
  return sum;
}

// The table's formula. N ranks in nodes of R (M = N / R); the plan is the sharding group's
// (all N ranks, or the S = R ranks of a MiCS shard group); s_u its unit shards.
LinkBytes expected_per_step(Row row, int stage, const PartitionPlan& plan, int modules, int N,
                            int R) {
  const std::int64_t G = kMicroBatches, M = N / R;
  const std::int64_t e_c = kComputeBytes, e_w = kWireBytes;
  const auto W = [](std::int64_t n) { return 4 * quantized_slice_words(n, kBlock); };
  // Per peer of the sharding group: the gathers, the reduce-scatters and the norm.
  std::int64_t gather = 0, reduce = 0;
  // qgZ: per peer within the node and per peer on another node (its two all-to-alls).
  std::int64_t qgz_intra = 0, qgz_inter = 0;
  // MiCS: per replica (on other nodes) the all-reduce of each slice, N / S replicas.
  std::int64_t replica = 0;
  const std::int64_t replicas = row == Row::kMics ? N / plan.world() : 1;
  for (const Unit& u : plan.units()) {
    const std::int64_t s = u.shard;
    // Stage 3 gathers a unit before its forward and its backward in every micro-batch; the last
    // module's unit is kept from one into the other, the tied unit is gathered three times
    // (test_engine_accounting); the persistent unit is resident and gathered after the step,
    // as stages 1-2 gather every unit (never quantized: qwZ is the micro-batch gathers).
    // A frozen unit (model.frozen) is gathered for its use at stage 3 like any other, but never
    // after a step (nothing changed it) and never reduced.
    if (stage == 3 && !u.persistent) {
      const int a = u.shared ? 3 : (u.modules == std::vector<int>{modules - 1} ? 1 : 2);
      gather += G * a * (quantizes_weights(row) ? W(s) : s * e_c);
    } else if (!u.frozen) {
      gather += s * e_c;
    }
    if (u.frozen) continue;
    const std::int64_t reductions = stage == 1 ? 1 : G;
    if (quantizes_gradients(row)) {
      qgz_intra += reductions * M * W(s);
      qgz_inter += reductions * W(s);
    } else {
      reduce += reductions * s * e_w;
    }
    if (replicas > 1) replica += reductions * 2 * e_w * ((s + replicas - 1) / replicas);
  }
  const std::int64_t norm = 2 * 4;  // one fp32 all-reduced: a one-element slice, sent twice
  const std::int64_t per_peer = gather + reduce + norm;
  LinkBytes out;
  if (row == Row::kMics) {  // the shard group is the node; replicas are on the other nodes
    out.intra = (R - 1) * per_peer;
    out.inter = (replicas - 1) * replica;
  } else {
    out.intra = (R - 1) * (per_peer + qgz_intra);
    out.inter = (N - R) * per_peer + (M - 1) * qgz_inter;
  }
  return out;
}

}  // namespace

TEST_CASE("bytes per step within and across nodes equal docs/multi-node.md's table exactly") {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world < 4 || world % 2 != 0) {
    WARN("the byte table needs 2 or more nodes of 2 or more ranks; world " << world);
    return;
  }
  const NodeTopology topo = test_topology(world / 2);
  const int N = world, R = topo.ranks_per_node();
  REQUIRE(topo.node_count() >= 2);
  REQUIRE(R >= 2);
  struct Case {
    Row row;
    int stage;
    bool frozen = false;  // the tied embedding and fc1's weight frozen (fc1's bias trained)
  };
  std::vector<Case> cases;
  for (int stage = 1; stage <= 3; ++stage) cases.push_back({Row::kPlain, stage});
  for (int stage = 1; stage <= 3; ++stage) cases.push_back({Row::kMics, stage});
  cases.push_back({Row::kQwz, 3});
  for (int stage = 2; stage <= 3; ++stage) cases.push_back({Row::kQgz, stage});
  cases.push_back({Row::kQwzQgz, 3});
  for (int stage = 1; stage <= 3; ++stage) cases.push_back({Row::kPlain, stage, true});
  cases.push_back({Row::kMics, 3, true});
  cases.push_back({Row::kQwzQgz, 3, true});
  LinkBytes plain3;
  for (const Case& c : cases) {
    TrainSpec spec;
    if (c.frozen) spec.frozen = {0, 1};
    spec.steps = 3;
    spec.accumulation = kMicroBatches;
    spec.quantization_block = kBlock;
    if (c.row == Row::kMics) spec.shard_size = R;  // one shard group per node
    if (quantizes_weights(c.row) || quantizes_gradients(c.row)) spec.ranks_per_node = R;
    auto run = make_engine(row_options(c.row, c.stage), spec);
    // Plain sharding and qwZ alone have no sub-groups: the world group splits by the nodes.
    if (!nodes_from_mpi()) run->group->set_node_map(topo.node_map());
    const LinkBytes expected =
        expected_per_step(c.row, c.stage, run->engine->plan(), run->model.modules(), N, R);
    for (int step = 0; step < spec.steps; ++step) {
      const LinkBytes before = sent_by(*run);
      train_one_step(*run, spec, step);
      const LinkBytes after = sent_by(*run);
      INFO(row_name(c.row) << " stage " << c.stage << (c.frozen ? ", frozen" : "") << " step "
                           << step + 1 << ": " << N << " ranks, " << R << " per node");
      CHECK(after.intra - before.intra == expected.intra);
      CHECK(after.inter - before.inter == expected.inter);
    }
    if (c.frozen) {
      // The split plan has frozen units, and they cut the bytes: no reduction, no publication.
      const auto& units = run->engine->plan().units();
      CHECK(std::count_if(units.begin(), units.end(), [](const Unit& u) { return u.frozen; }) == 2);
      if (c.row == Row::kPlain && c.stage == 3) {
        CHECK(expected.intra + expected.inter < plain3.intra + plain3.inter);
      }
      continue;
    }
    if (c.row == Row::kPlain && c.stage == 3) plain3 = expected;
    if (c.stage == 3 && c.row != Row::kPlain) {
      if (run->group->rank() == 0)
        WARN(row_name(c.row) << " stage 3: bytes per step per rank within the node "
                             << expected.intra << ", across nodes " << expected.inter
                             << " (plain: " << plain3.intra << ", " << plain3.inter << ")");
      CHECK(expected.inter < plain3.inter);  // what each scheme is for
    }
  }
}
