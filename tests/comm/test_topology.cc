// Node topology and sub-groups on the MPI backend (ctest runs 4 and 8 ranks on one machine,
// which comm.ranks_per_node splits into simulated nodes; tests/multinode runs the [multihost]
// cases across two network-namespace hosts). The layout checks are pure and run everywhere.
#include <catch2/catch.hpp>

#include <cstdlib>

#include "runtime/comm/topology.h"
#include "runtime/common/error.h"
#include "tests/comm/subgroup_checks.h"

using namespace zrt;
using namespace zrt::test;

TEST_CASE("from_groups accepts blocks of consecutive ranks and names every mismatch") {
  const NodeTopology t = NodeTopology::from_groups({5, 5, 9, 9}, {"a", "a", "b", "b"});
  CHECK(t.node_count() == 2);
  CHECK(t.ranks_per_node() == 2);
  CHECK(t.node_map() == std::vector<int>{0, 0, 1, 1});
  CHECK(t.local_rank(3) == 1);
  CHECK(t.describe() == "2 nodes x 2 ranks");
  // One shared-memory group, two host names.
  CHECK_THROWS_WITH(NodeTopology::from_groups({0, 0, 0, 0}, {"a", "a", "b", "b"}),
                    Catch::Contains("ranks 0 and 2 share memory (one MPI node) but run on hosts "
                                    "'a' and 'b'"));
  // One host name, two groups (two hosts that were given the same name).
  CHECK_THROWS_WITH(NodeTopology::from_groups({0, 0, 2, 2}, {"h", "h", "h", "h"}),
                    Catch::Contains("ranks 0 and 2 run on hosts of the same name 'h'"));
  // Round-robin placement and uneven nodes.
  CHECK_THROWS_WITH(NodeTopology::from_groups({0, 1, 0, 1}, {"a", "b", "a", "b"}),
                    Catch::Contains("not placed in blocks of 2 consecutive ranks"));
  CHECK_THROWS_WITH(NodeTopology::from_groups({0, 0, 0, 3}, {"a", "a", "a", "b"}),
                    Catch::Contains("not placed in blocks of 3 consecutive ranks"));
  CHECK_THROWS_WITH(NodeTopology(6, 4), Catch::Contains("6 ranks cannot form nodes of 4"));
}

TEST_CASE("sub-group plans: node, inter-node, MiCS shard and replica members") {
  const std::vector<int> nodes = NodeTopology(8, 4).node_map();  // 2 nodes x 4
  CHECK(intra_node_plan(nodes, 5).members == std::vector<int>{4, 5, 6, 7});
  CHECK(intra_node_plan(nodes, 5).color == 1);
  CHECK(inter_node_plan(nodes, 5).members == std::vector<int>{1, 5});
  CHECK(inter_node_plan(nodes, 5).color == 1);
  CHECK(shard_plan(8, 2, 5).members == std::vector<int>{4, 5});
  CHECK(replica_plan(8, 2, 5).members == std::vector<int>{1, 3, 5, 7});
  CHECK(shard_plan(8, 4, 2).members == std::vector<int>{0, 1, 2, 3});
  CHECK(replica_plan(8, 4, 2).members == std::vector<int>{2, 6});
  CHECK_THROWS_WITH(shard_plan(8, 3, 0),
                    Catch::Contains("shard groups of 3 ranks do not divide 8"));
  CHECK_THROWS_WITH(inter_node_plan({0, 0, 1}, 0),
                    Catch::Contains("inter-node groups need equally many ranks on every node"));
}

TEST_CASE("detect: one machine is one node unless comm.ranks_per_node simulates more") {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const NodeTopology real = NodeTopology::detect(MPI_COMM_WORLD);
  if (const char* expect = std::getenv("ZRT_EXPECT_NODES")) {
    CHECK(real.node_count() == std::atoi(expect));  // the multi-host harness says how many
  } else {
    CHECK(real.node_count() == 1);
  }
  if (real.node_count() == 1 && world % 2 == 0) {
    const NodeTopology two = NodeTopology::detect(MPI_COMM_WORLD, world / 2);
    CHECK(two.node_count() == 2);
    CHECK(two.ranks_per_node() == world / 2);
  }
  if (world == 8 && real.node_count() == 1) {
    CHECK_THROWS_WITH(
        NodeTopology::detect(MPI_COMM_WORLD, 3),
        Catch::Contains("comm.ranks_per_node 3 does not divide the 8 ranks per node"));
  }
}

TEST_CASE("collectives on node, inter-node, shard and replica sub-groups are exact",
          "[multihost]") {
  auto f = make_comm({}, "world");
  const NodeTopology real = NodeTopology::detect(MPI_COMM_WORLD);
  if (real.node_count() > 1) {
    check_subgroups(f, real.ranks_per_node(), real.ranks_per_node());
    return;
  }
  // Simulated: 2 nodes at 4 ranks (2 x 2, shards of 2); at 8 ranks 2 x 4 and 4 x 2.
  REQUIRE(f.size() % 2 == 0);
  check_subgroups(f, f.size() / 2, 2);
  if (f.size() == 8) check_subgroups(f, 2, 4);
}

TEST_CASE("intra/inter byte counters of the world group, by hand for 2 nodes x 4") {
  auto f = make_comm({}, "counted");
  if (f.size() != 8) return;  // the figures below are for 8 ranks
  f.group->set_node_map(NodeTopology(8, 4).node_map());
  Buffer a = upload(*f.device, *f.stream, {}, 8 * 1000 * 4);
  Buffer b = upload(*f.device, *f.stream, {}, 8 * 1000 * 4);
  f.device->fill_zero(a.device<std::byte>(), 8 * 1000 * 4, *f.stream);
  f.group->all_gather(a.device<std::byte>(), b.device<std::byte>(), 1000, DType::kFloat32);
  f.group->reduce_scatter(a.device<std::byte>(), b.device<std::byte>(), 1000, DType::kBFloat16,
                          ReduceOp::kSum);
  f.group->broadcast(a.device<std::byte>(), 10, DType::kInt64, 5);
  f.stream->synchronize();
  const CommCounts c = f.group->stats().snapshot();
  // all-gather: 4000 bytes to each of 3 ranks on the node and 4 off it.
  CHECK(c.intra_bytes[0] == 12000);
  CHECK(c.inter_bytes[0] == 16000);
  // reduce-scatter of bf16 blocks of 1000: 2000 bytes per peer.
  CHECK(c.intra_bytes[1] == 6000);
  CHECK(c.inter_bytes[1] == 8000);
  // broadcast: only the root (rank 5) sends, 80 bytes to each peer.
  CHECK(c.intra_bytes[3] == (f.rank() == 5 ? 240 : 0));
  CHECK(c.inter_bytes[3] == (f.rank() == 5 ? 320 : 0));
  CHECK(c.total_intra_bytes() == 12000 + 6000 + (f.rank() == 5 ? 240 : 0));
}

TEST_CASE("a node map of the wrong size and a plan this rank is not in are refused") {
  auto f = make_comm({}, "refusals");
  CHECK_THROWS_WITH(
      f.group->set_node_map({0}),
      Catch::Contains(fmt::format("has {} ranks but its node map names 1", f.size())));
  SubgroupPlan wrong;
  wrong.members = {f.size()};  // nobody's rank
  CHECK_THROWS_WITH(make_subgroup(*f.group, wrong, *f.stream, "nobody"),
                    Catch::Contains("is not among its members"));
}
