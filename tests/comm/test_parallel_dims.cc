// ParallelDims (pure): the shard world of every stage, the subgroup plans of each axis (every
// rank in exactly one group of each kind, the groups' colours distinct), and validate()'s
// problems, each naming its key.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <set>

#include "runtime/comm/parallel_dims.h"
#include "runtime/common/error.h"

using namespace zrt;

namespace {

ParallelDims dims_of(int world, int ranks_per_node, int stage) {
  ParallelDims d;
  d.world = world;
  d.ranks_per_node = ranks_per_node;
  d.stage = stage;
  return d;
}

bool mentions(const std::vector<std::string>& problems, const std::string& text) {
  for (const std::string& p : problems) {
    if (p.find(text) != std::string::npos) return true;
  }
  return false;
}

// The plans of every rank partition the world: each rank is in its own plan's members, every
// rank of a colour lists the same members, and distinct groups have distinct colours.
template <typename PlanOf>
std::map<int, std::vector<int>> check_partition(int world, PlanOf plan_of) {
  std::map<int, std::vector<int>> groups;
  for (int r = 0; r < world; ++r) {
    const SubgroupPlan plan = plan_of(r);
    INFO("rank " << r);
    CHECK(std::count(plan.members.begin(), plan.members.end(), r) == 1);
    auto [it, fresh] = groups.emplace(plan.color, plan.members);
    if (!fresh) CHECK(it->second == plan.members);
  }
  std::size_t covered = 0;
  for (const auto& [color, members] : groups) covered += members.size();
  CHECK(covered == static_cast<std::size_t>(world));
  return groups;
}

}  // namespace

TEST_CASE("the shard world of each stage, with and without MiCS") {
  for (int world : {1, 2, 4, 8, 16}) {
    ParallelDims d = dims_of(world, 0, 0);
    CHECK(d.shard_world() == 1);
    for (int stage = 1; stage <= 3; ++stage) {
      d.stage = stage;
      CHECK(d.shard_world() == world);
      CHECK(d.replica_count() == 1);
      CHECK_FALSE(d.uses_mics());
    }
    CHECK(d.shard_world(0) == 1);
    if (world >= 4) {
      d.mics_shard_size = world / 2;
      CHECK(d.uses_mics());
      CHECK(d.shard_world() == world / 2);
      CHECK(d.replica_count() == 2);
      CHECK(d.shard_world(0) == 1);
      CHECK(d.validate().empty());
    }
  }
  // hpZ is in effect at stage 3 only.
  ParallelDims d = dims_of(8, 4, 2);
  d.hpz_partition_size = 4;
  CHECK(d.hpz() == 0);
  d.stage = 3;
  CHECK(d.hpz() == 4);
  CHECK(d.validate().empty());
  d.hpz_partition_size = 1;
  CHECK(d.hpz() == 0);
}

TEST_CASE("subgroup plans: MiCS, hpZ, sequence, data and expert parallel groups") {
  ParallelDims d = dims_of(8, 4, 3);
  d.mics_shard_size = 4;
  CHECK(d.shard_group_plan(5).members == std::vector<int>{4, 5, 6, 7});
  CHECK(d.replica_group_plan(5).members == std::vector<int>{1, 5});
  check_partition(8, [&](int r) { return d.shard_group_plan(r); });
  check_partition(8, [&](int r) { return d.replica_group_plan(r); });

  ParallelDims h = dims_of(8, 4, 3);
  h.hpz_partition_size = 2;
  CHECK(h.hpz_group_plan(5).members == std::vector<int>{4, 5});
  check_partition(8, [&](int r) { return h.hpz_group_plan(r); });
  h.stage = 2;
  CHECK_THROWS_WITH(h.hpz_group_plan(0), Catch::Contains("without hpZ"));

  // At sp 1 and ep 1 the data-parallel and expert-data-parallel groups are the world, and each
  // rank is its own sp and ep group.
  const ParallelDims flat = dims_of(4, 0, 1);
  CHECK(flat.data_parallel_plan(2).members == std::vector<int>{0, 1, 2, 3});
  CHECK(flat.expert_data_parallel_plan(2).members == std::vector<int>{0, 1, 2, 3});
  CHECK(flat.sequence_parallel_plan(2).members == std::vector<int>{2});
  CHECK(flat.expert_parallel_plan(2).members == std::vector<int>{2});
  CHECK(flat.data_parallel_size() == 4);
  CHECK(flat.expert_data_parallel_size() == 4);

  // 16 ranks, sp 2: sp blocks {0,1},{2,3},...; data-parallel groups the even and the odd ranks;
  // ep 2 over each data-parallel group; an expert's data-parallel group spans the sp blocks of
  // the ranks holding it (their chunks route other tokens of the same sequences to it).
  ParallelDims e = dims_of(16, 8, 3);
  e.sequence_parallel_size = 2;
  e.expert_parallel_size = 2;
  CHECK(e.validate().empty());
  CHECK(e.data_parallel_size() == 8);
  CHECK(e.expert_data_parallel_size() == 8);
  CHECK(e.shard_world() == 16);  // ZeRO shards over the whole world, sp blocks included
  CHECK(e.sequence_parallel_plan(5).members == std::vector<int>{4, 5});
  CHECK(e.data_parallel_plan(5).members == std::vector<int>{1, 3, 5, 7, 9, 11, 13, 15});
  CHECK(e.expert_parallel_plan(5).members == std::vector<int>{5, 7});
  CHECK(e.expert_data_parallel_plan(5).members == std::vector<int>{0, 1, 4, 5, 8, 9, 12, 13});
  CHECK(e.expert_parallel_plan(12).members == std::vector<int>{12, 14});
  CHECK(e.expert_data_parallel_plan(12).members == std::vector<int>{0, 1, 4, 5, 8, 9, 12, 13});
  CHECK(e.expert_data_parallel_plan(2).members == std::vector<int>{2, 3, 6, 7, 10, 11, 14, 15});
  for (int sp : {1, 2, 4}) {
    for (int ep : {1, 2, 4}) {
      ParallelDims x = dims_of(16, 8, 1);
      x.sequence_parallel_size = sp;
      x.expert_parallel_size = ep;
      INFO("sp " << sp << " ep " << ep);
      REQUIRE(x.validate().empty());
      check_partition(16, [&](int r) { return x.sequence_parallel_plan(r); });
      check_partition(16, [&](int r) { return x.data_parallel_plan(r); });
      const auto ep_groups = check_partition(16, [&](int r) { return x.expert_parallel_plan(r); });
      const auto edp_groups =
          check_partition(16, [&](int r) { return x.expert_data_parallel_plan(r); });
      CHECK(ep_groups.size() == static_cast<std::size_t>(16 / ep));
      CHECK(edp_groups.size() == static_cast<std::size_t>(ep));
      // An expert-parallel group and an expert-data-parallel group meet in exactly one rank.
      for (int r = 0; r < 16; ++r) {
        const auto a = x.expert_parallel_plan(r).members;
        const auto b = x.expert_data_parallel_plan(r).members;
        std::set<int> common;
        for (int m : a) {
          if (std::count(b.begin(), b.end(), m) != 0) common.insert(m);
        }
        CHECK(common == std::set<int>{r});
      }
    }
  }
}

TEST_CASE("validate() accepts the layouts the trainer runs") {
  for (int world : {1, 2, 4, 8}) {
    for (int stage = 0; stage <= 3; ++stage) {
      ParallelDims d = dims_of(world, world >= 4 ? world / 2 : 0, stage);
      d.quantized_weights = stage == 3;
      d.quantized_gradients = stage >= 2;
      INFO("world " << world << " stage " << stage);
      CHECK(d.validate().empty());
      CHECK_NOTHROW(d.check());
    }
  }
}

TEST_CASE("validate() names the key and the fix of every problem") {
  CHECK(mentions(dims_of(0, 0, 1).validate(), "the world has 0 ranks"));
  CHECK(mentions(dims_of(6, 4, 1).validate(), "comm.ranks_per_node 4 does not divide the 6"));
  CHECK(mentions(dims_of(4, 0, 5).validate(), "zero_optimization.stage 5 does not exist"));

  ParallelDims mics = dims_of(8, 4, 0);
  mics.mics_shard_size = 3;
  const auto m = mics.validate();
  CHECK(m.size() == 2);  // both problems, not the first alone
  CHECK(mentions(m, "mics_shard_size: hierarchical sharding needs stage 1, 2 or 3"));
  CHECK(mentions(m, "mics_shard_size 3 does not divide the 8 ranks ZeRO shards over"));

  ParallelDims hpz = dims_of(8, 2, 2);
  hpz.hpz_partition_size = 4;
  hpz.mics_shard_size = 4;
  const auto h = hpz.validate();
  CHECK(mentions(h, "zero_hpz_partition_size 4: hpZ keeps secondary shards of stage 3's"));
  CHECK(mentions(h, "zero_hpz_partition_size with mics_shard_size is not supported"));
  CHECK(mentions(h, "does not divide the 2 ranks per node"));
  CHECK(mentions(h, "make it the ranks per node or a divisor of it"));
  ParallelDims hpz3 = dims_of(12, 0, 3);
  hpz3.hpz_partition_size = 8;
  CHECK(mentions(hpz3.validate(), "zero_hpz_partition_size 8 does not divide the 12 ranks"));
  hpz3.hpz_partition_size = -1;
  CHECK(mentions(hpz3.validate(), "must be >= 1 (1: off), not -1"));

  ParallelDims q = dims_of(4, 0, 1);
  q.quantized_weights = true;
  q.quantized_gradients = true;
  CHECK(mentions(q.validate(), "zero_quantized_weights: qwZ quantizes stage 3's"));
  CHECK(mentions(q.validate(), "zero_quantized_gradients: qgZ quantizes the reduce-scatters"));

  ParallelDims sp = dims_of(8, 2, 1);
  sp.sequence_parallel_size = 4;
  CHECK(mentions(sp.validate(), "sequence_parallel_size 4 does not divide the 2 ranks per node"));
  sp.sequence_parallel_size = 3;
  CHECK(mentions(sp.validate(), "sequence_parallel_size 3 does not divide the 8 ranks"));
  sp.sequence_parallel_size = 0;
  CHECK(mentions(sp.validate(), "sequence_parallel_size 0 must be >= 1"));
  // The data-parallel degree is world / sp: ep divides it. ZeRO shards over the whole world, so
  // MiCS and hpZ groups divide the world, not world / sp.
  ParallelDims spm = dims_of(8, 4, 1);
  spm.sequence_parallel_size = 2;
  spm.mics_shard_size = 8;
  CHECK(spm.validate().empty());
  spm.mics_shard_size = 16;
  CHECK(mentions(spm.validate(),
                 "mics_shard_size 16 does not divide the 8 ranks ZeRO shards over "
                 "(the world, every sequence-parallel rank included)"));
  spm.mics_shard_size = 0;
  spm.stage = 3;
  spm.sequence_parallel_size = 4;
  spm.hpz_partition_size = 4;
  CHECK(spm.validate().empty());
  spm.hpz_partition_size = 0;
  spm.stage = 1;
  spm.sequence_parallel_size = 2;
  spm.expert_parallel_size = 8;
  CHECK(mentions(spm.validate(),
                 "expert_parallel_size 8 does not divide the data-parallel "
                 "degree 4 (world 8 / sequence_parallel_size 2)"));
  spm.expert_parallel_size = 0;
  CHECK(mentions(spm.validate(), "expert_parallel_size 0 must be >= 1"));

  // ZeRO++ with expert parallelism: its collectives over the expert-data-parallel group run by
  // node, which must each hold as many of the group's ranks. 2 nodes of 4 at ep 2: {0,2,4,6} and
  // {1,3,5,7}, two a node; 2 nodes of 3 at ep 2: {0,2,4} holds two ranks of node 0, one of node 1.
  ParallelDims zeropp = dims_of(8, 4, 3);
  zeropp.expert_parallel_size = 2;
  zeropp.quantized_gradients = true;
  CHECK(zeropp.validate().empty());
  zeropp.world = 6;
  zeropp.ranks_per_node = 3;
  CHECK(mentions(zeropp.validate(),
                 "expert_parallel.autoep_size 2 with zero_quantized_weights / "
                 "zero_quantized_gradients: rank 0's experts are sliced over a group with unequal "
                 "numbers of ranks on its "
                 "nodes"));
  zeropp.quantized_gradients = false;  // unquantized: any split of the nodes
  CHECK(zeropp.validate().empty());

  // hpZ with expert parallelism: the experts' secondary shards over their expert-data-parallel
  // ranks in each hpZ block. 8 ranks, blocks of 4, ep 2 (E + D: {0,2,4,6}, {1,3,5,7}): two of
  // each in every block; unequal counts are refused.
  ParallelDims experts_hpz = dims_of(8, 4, 3);
  experts_hpz.hpz_partition_size = 4;
  experts_hpz.expert_parallel_size = 2;
  CHECK(experts_hpz.validate().empty());
  for (int r = 0; r < 8; ++r) {
    const SubgroupPlan plan = experts_hpz.expert_hpz_group_plan(r);
    CHECK(plan.members.size() == 2);
    for (int m : plan.members) CHECK(m / 4 == r / 4);
    for (int m : plan.members) CHECK(m % 2 == r % 2);
  }
  check_partition(8, [&](int r) { return experts_hpz.expert_hpz_group_plan(r); });
  experts_hpz.data_before_expert_parallel = true;  // D + E: edp groups {0,1,2,3}, {4,5,6,7}
  CHECK(experts_hpz.validate().empty());
  CHECK(experts_hpz.expert_hpz_group_plan(5).members == std::vector<int>({4, 5, 6, 7}));
  ParallelDims uneven = dims_of(12, 6, 3);
  uneven.hpz_partition_size = 3;
  uneven.expert_parallel_size = 2;  // edp {0,2,4,...}: 2 in block {0,1,2}, 1 in {3,4,5}
  CHECK(mentions(uneven.validate(),
                 "zero_optimization.zero_hpz_partition_size 3 with "
                 "expert_parallel.autoep_size 2: the hpZ blocks hold unequal numbers of ranks"));

  CHECK_THROWS_WITH(mics.check(), Catch::Contains("the parallel layout (world 8 (2 nodes x 4), "
                                                  "stage 0, MiCS shards of 3) is inconsistent") &&
                                      Catch::Contains("mics_shard_size 3 does not divide"));
}

// MiCS with expert parallelism: the experts' state is sliced over the ranks of their
// expert-data-parallel group inside each MiCS shard block and averaged again over the ranks at
// the same place of that group's share of every other block.
TEST_CASE("MiCS with expert parallelism: the experts' shard and replica groups", "[mics][ep]") {
  // 8 ranks, blocks of 4, ep 2 (E + D: edp {0,2,4,6}, {1,3,5,7}): shards {0,2}, {1,3}, {4,6},
  // {5,7}; replicas {0,4}, {2,6}, {1,5}, {3,7}.
  ParallelDims d = dims_of(8, 4, 3);
  d.mics_shard_size = 4;
  d.expert_parallel_size = 2;
  CHECK(d.validate().empty());
  CHECK(d.expert_shard_world() == 2);
  check_partition(8, [&](int r) { return d.expert_shard_group_plan(r); });
  check_partition(8, [&](int r) { return d.expert_replica_group_plan(r); });
  CHECK(d.expert_shard_group_plan(6).members == std::vector<int>({4, 6}));
  CHECK(d.expert_replica_group_plan(6).members == std::vector<int>({2, 6}));
  // Blocks of 2 hold one rank of each expert set: the experts whole on every rank, averaged over
  // the expert-data-parallel group.
  d.mics_shard_size = 2;
  CHECK(d.validate().empty());
  CHECK(d.expert_shard_world() == 1);
  CHECK(d.expert_shard_group_plan(3).members == std::vector<int>({3}));
  CHECK(d.expert_replica_group_plan(3).members == std::vector<int>({1, 3, 5, 7}));
  // D + E (edp {0,1,2,3}, {4,5,6,7}): blocks of 4 are whole expert-data-parallel groups (no
  // replicas); blocks of 2 halve them.
  d.data_before_expert_parallel = true;
  CHECK(d.expert_shard_group_plan(5).members == std::vector<int>({4, 5}));
  CHECK(d.expert_replica_group_plan(5).members == std::vector<int>({5, 7}));
  d.mics_shard_size = 4;
  CHECK(d.expert_shard_group_plan(5).members == std::vector<int>({4, 5, 6, 7}));
  CHECK(d.expert_replica_group_plan(5).members == std::vector<int>({5}));
  // sp 2: an expert's group holds every rank of its sp blocks (edp of 0: {0,1,4,5}).
  d.data_before_expert_parallel = false;
  d.sequence_parallel_size = 2;
  CHECK(d.validate().empty());
  CHECK(d.expert_shard_group_plan(1).members == std::vector<int>({0, 1}));
  CHECK(d.expert_replica_group_plan(1).members == std::vector<int>({1, 5}));

  // Every layout validate() accepts: a rank's shard group lies in its block and its
  // expert-data-parallel group, its replicas in that group at its own place of each block's
  // share, and the two groups meet at the rank alone and multiply to the group's size.
  int accepted = 0;
  for (const int world : {4, 8, 12, 16}) {
    for (const int sp : {1, 2, 4}) {
      for (const int ep : {2, 4}) {
        for (const int mics : {1, 2, 3, 4, 6, 8, 16}) {
          for (const bool d_before_e : {false, true}) {
            ParallelDims l = dims_of(world, 0, 2);
            l.sequence_parallel_size = sp;
            l.expert_parallel_size = ep;
            l.mics_shard_size = mics;
            l.data_before_expert_parallel = d_before_e;
            if (!l.validate().empty()) continue;
            ++accepted;
            INFO("world " << world << " sp " << sp << " ep " << ep << " mics " << mics
                          << (d_before_e ? " D+E" : " E+D"));
            check_partition(world, [&](int r) { return l.expert_shard_group_plan(r); });
            check_partition(world, [&](int r) { return l.expert_replica_group_plan(r); });
            for (int r = 0; r < world; ++r) {
              const std::vector<int> edp = l.expert_data_parallel_plan(r).members;
              const std::vector<int> shard = l.expert_shard_group_plan(r).members;
              const std::vector<int> replicas = l.expert_replica_group_plan(r).members;
              CHECK(static_cast<int>(shard.size()) == l.expert_shard_world());
              CHECK(shard.size() * replicas.size() == edp.size());
              std::vector<int> both;
              for (int m : shard) {
                CHECK(m / mics == r / mics);
                CHECK(std::count(edp.begin(), edp.end(), m) == 1);
                if (std::count(replicas.begin(), replicas.end(), m) == 1) both.push_back(m);
              }
              CHECK(both == std::vector<int>({r}));
              const auto place = [&](int rank) {
                const std::vector<int> own = l.expert_shard_group_plan(rank).members;
                return std::find(own.begin(), own.end(), rank) - own.begin();
              };
              for (int m : replicas) {
                CHECK(std::count(edp.begin(), edp.end(), m) == 1);
                CHECK(place(m) == place(r));
              }
            }
          }
        }
      }
    }
  }
  CHECK(accepted > 40);

  // Unequal shares are refused with a fix for the order in use: 12 ranks, blocks of 3, ep 2
  // (E + D: block {0,1,2} holds two of {0,2,...}, one of {1,3,...}).
  ParallelDims uneven = dims_of(12, 0, 2);
  uneven.mics_shard_size = 3;
  uneven.expert_parallel_size = 2;
  CHECK(mentions(uneven.validate(),
                 "zero_optimization.mics_shard_size 3 with expert_parallel.autoep_size 2: the "
                 "shard groups hold unequal numbers of ranks of an expert-data-parallel group (2 "
                 "and 1), and each expert's state is sliced over those; make mics_shard_size a "
                 "multiple of autoep_size x sequence_parallel_size (2)"));
  uneven.mics_shard_size = 4;  // D + E: edp blocks of 6, and {4,...,7} holds two of each
  uneven.data_before_expert_parallel = true;
  CHECK(mentions(uneven.validate(),
                 "make mics_shard_size a divisor or a multiple of the 6 ranks "
                 "of an expert-data-parallel group"));
  // ZeRO++ over the experts' shard group: by node, as many of its ranks on each. 2 nodes of 4,
  // blocks of 8 at ep 2: shards {0,2,4,6} (two a node); at 3 ranks a node of 6, {0,2,4}: refused.
  ParallelDims quantized = dims_of(8, 4, 3);
  quantized.mics_shard_size = 8;
  quantized.expert_parallel_size = 2;
  quantized.quantized_gradients = true;
  CHECK(quantized.validate().empty());
  quantized.world = 6;
  quantized.ranks_per_node = 3;
  quantized.mics_shard_size = 6;
  CHECK(mentions(quantized.validate(),
                 "rank 0's experts are sliced over a group with unequal "
                 "numbers of ranks on its nodes"));
  quantized.mics_shard_size = 2;  // shards of one rank: nothing to split by node
  CHECK(quantized.validate().empty());
}
