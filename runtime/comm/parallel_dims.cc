#include "runtime/comm/parallel_dims.h"

#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include "runtime/common/error.h"

namespace zrt {

std::vector<std::string> ParallelDims::validate() const {
  std::vector<std::string> problems;
  if (world < 1) {
    problems.push_back(fmt::format("the world has {} ranks; run at least one", world));
    return problems;  // every other figure divides it
  }
  const bool nodes_known = ranks_per_node > 0 && world % ranks_per_node == 0;
  if (ranks_per_node < 0 || (ranks_per_node > 0 && world % ranks_per_node != 0)) {
    problems.push_back(fmt::format(
        "comm.ranks_per_node {} does not divide the {} ranks: nodes are equal blocks of "
        "consecutive ranks; give a divisor of the world size (or 0 to detect the nodes)",
        ranks_per_node, world));
  }
  if (stage < 0 || stage > 3) {
    problems.push_back(
        fmt::format("zero_optimization.stage {} does not exist; use 0, 1, 2 or 3", stage));
  }

  const int sp = sequence_parallel_size;
  bool dp_known = false;
  if (sp < 1) {
    problems.push_back(fmt::format("sequence_parallel_size {} must be >= 1 (1: off)", sp));
  } else if (world % sp != 0) {
    problems.push_back(fmt::format(
        "sequence_parallel_size {} does not divide the {} ranks: sequence-parallel groups are "
        "equal blocks of consecutive ranks; give a divisor of the world size",
        sp, world));
  } else {
    dp_known = true;
    if (nodes_known && !blocks_within_nodes(sp)) {
      problems.push_back(fmt::format(
          "sequence_parallel_size {} does not divide the {} ranks per node: a group of {} "
          "consecutive ranks would span two nodes, and sequence parallelism exchanges "
          "activations every layer; make it the ranks per node or a divisor of it",
          sp, ranks_per_node, sp));
    }
  }
  const int dp = dp_known ? data_parallel_size() : 0;

  const int ep = expert_parallel_size;
  if (ep < 1) {
    problems.push_back(fmt::format("expert_parallel_size {} must be >= 1 (1: off)", ep));
  } else if (dp_known && dp % ep != 0) {
    problems.push_back(fmt::format(
        "expert_parallel_size {} does not divide the data-parallel degree {} (world {} / "
        "sequence_parallel_size {}): give a divisor of it",
        ep, dp, world, sp));
  }

  if (mics_shard_size > 0) {
    if (stage == 0) {
      problems.push_back(
          "zero_optimization.mics_shard_size: hierarchical sharding needs stage 1, 2 or 3 "
          "(stage is 0); set a stage or remove mics_shard_size");
    }
    // ZeRO shards over the whole world at any sequence_parallel_size (every rank of an sp block
    // holds the same parameters and reduces its chunk's gradients like a data-parallel rank),
    // so a shard group need not align with the sp blocks: it only tiles the world.
    if (mics_shard_size > world || world % mics_shard_size != 0) {
      problems.push_back(fmt::format(
          "zero_optimization.mics_shard_size {} does not divide the {} ranks ZeRO shards over "
          "(the world, every sequence-parallel rank included): shard groups are equal blocks of "
          "consecutive ranks (e.g. the ranks of one node); give a divisor of it",
          mics_shard_size, world));
    }
  }

  const int S = hpz_partition_size;
  if (S < 0) {
    problems.push_back(
        fmt::format("zero_optimization.zero_hpz_partition_size must be >= 1 (1: off), not {}", S));
  } else if (S > 1) {
    if (stage != 3) {
      problems.push_back(fmt::format(
          "zero_optimization.zero_hpz_partition_size {}: hpZ keeps secondary shards of stage 3's "
          "gathered parameters (stage is {}); set stage 3 or zero_hpz_partition_size 1",
          S, stage));
    }
    if (mics_shard_size > 0) {
      problems.push_back(
          "zero_optimization.zero_hpz_partition_size with mics_shard_size is not supported: MiCS "
          "already keeps every parameter gather inside its shard group; use one of them");
    }
    // The gathers span the world at any sequence_parallel_size, as the shards do.
    if (world % S != 0) {
      problems.push_back(fmt::format(
          "zero_optimization.zero_hpz_partition_size {} does not divide the {} ranks the "
          "parameters are gathered over: hpZ groups are equal blocks of consecutive ranks; give "
          "a divisor of it",
          S, world));
    }
    if (nodes_known && world % S == 0 && !blocks_within_nodes(S)) {
      problems.push_back(fmt::format(
          "zero_optimization.zero_hpz_partition_size {} does not divide the {} ranks per node: "
          "hpZ groups of {} consecutive ranks would span nodes and the backward gathers would "
          "cross them; make it the ranks per node or a divisor of it",
          S, ranks_per_node, S));
    }
  }

  if (quantized_weights && stage != 3) {
    problems.push_back(fmt::format(
        "zero_optimization.zero_quantized_weights: qwZ quantizes stage 3's parameter gathers "
        "(stage is {}); set stage 3 or turn it off",
        stage));
  }
  if (quantized_gradients && stage < 2) {
    problems.push_back(fmt::format(
        "zero_optimization.zero_quantized_gradients: qgZ quantizes the reduce-scatters of stages "
        "2-3 (stage is {}); set stage 2 or 3, or turn it off",
        stage));
  }
  for (const KeyedProblem& p : expert_placement_problems()) {
    problems.push_back(p.key + " " + p.message);
  }
  return problems;
}

// hpZ and MiCS with expert parallelism: the experts' secondary shards (hpZ) or their state (MiCS)
// are kept over the ranks of their expert-data-parallel group inside each block, as many in
// every block; ZeRO++'s collectives over the experts' shard group run by node. Only layouts the
// rest of validate() accepts are placed (a degree that does not divide is reported there).
std::vector<ParallelDims::KeyedProblem> ParallelDims::expert_placement_problems() const {
  std::vector<KeyedProblem> problems;
  const int ep = expert_parallel_size, sp = sequence_parallel_size;
  if (world < 1 || ep <= 1 || sp < 1 || world % sp != 0 || data_parallel_size() % ep != 0) {
    return problems;
  }
  std::size_t first = 0, other = 0;
  if (hpz() > 1 && world % hpz() == 0 && !expert_shares_even(hpz(), &first, &other)) {
    problems.push_back(
        {"zero_optimization.zero_hpz_partition_size",
         fmt::format("{} with expert_parallel.autoep_size {}: the hpZ blocks hold unequal "
                     "numbers of ranks of an expert-data-parallel group ({} and {}), and each "
                     "expert's secondary shards are kept over those; make autoep_size divide "
                     "zero_hpz_partition_size",
                     hpz(), ep, first, other)});
  }
  const bool mics_tiles =
      !uses_mics() || (mics_shard_size <= world && world % mics_shard_size == 0);
  bool experts_sliced_evenly = mics_tiles;
  if (uses_mics() && mics_tiles && !expert_shares_even(mics_shard_size, &first, &other)) {
    experts_sliced_evenly = false;
    problems.push_back(
        {"zero_optimization.mics_shard_size",
         fmt::format("{} with expert_parallel.autoep_size {}: the shard groups hold unequal "
                     "numbers of ranks of an expert-data-parallel group ({} and {}), and each "
                     "expert's state is sliced over those; {}",
                     mics_shard_size, ep, first, other,
                     data_before_expert_parallel
                         ? fmt::format("make mics_shard_size a divisor or a multiple of the {} "
                                       "ranks of an expert-data-parallel group (consecutive with "
                                       "use_data_before_expert_parallelism)",
                                       expert_data_parallel_size())
                         : fmt::format("make mics_shard_size a multiple of autoep_size x "
                                       "sequence_parallel_size ({})",
                                       ep * sp))});
  }
  const bool nodes_known = ranks_per_node > 0 && world % ranks_per_node == 0;
  if (nodes_known && quantized() && experts_sliced_evenly) {
    for (int rank = 0; rank < world; ++rank) {
      std::vector<int> per_node(static_cast<std::size_t>(world / ranks_per_node), 0);
      for (int member : expert_shard_group_plan(rank).members) {
        ++per_node[static_cast<std::size_t>(member / ranks_per_node)];
      }
      int first_count = 0;
      for (int count : per_node) first_count = first_count > 0 ? first_count : count;
      bool even = true;
      for (int count : per_node) even = even && (count == 0 || count == first_count);
      if (!even) {
        problems.push_back(
            {"expert_parallel.autoep_size",
             fmt::format("{} with zero_quantized_weights / zero_quantized_gradients: rank {}'s "
                         "experts are sliced over a group with unequal numbers of ranks on its "
                         "nodes ({} ranks per node), and ZeRO++'s collectives over it run "
                         "hierarchically by node; make autoep_size divide the ranks per node",
                         ep, rank, ranks_per_node)});
        break;
      }
    }
  }
  return problems;
}

void ParallelDims::check() const {
  const std::vector<std::string> problems = validate();
  if (problems.empty()) return;
  ZRT_THROW(InvalidArgument, "the parallel layout ({}) is inconsistent:\n  {}", describe(),
            fmt::join(problems, "\n  "));
}

bool ParallelDims::blocks_within_nodes(int size) const {
  if (size < 1 || world % size != 0) return false;
  return ranks_per_node <= 0 || ranks_per_node % size == 0;
}

int ParallelDims::shard_world(int at_stage) const {
  if (at_stage == 0) return 1;
  return mics_shard_size > 0 ? mics_shard_size : world;
}

SubgroupPlan ParallelDims::shard_group_plan(int rank) const {
  ZRT_CHECK(mics_shard_size > 0, "shard_group_plan() without mics_shard_size");
  return shard_plan(world, mics_shard_size, rank);
}

SubgroupPlan ParallelDims::replica_group_plan(int rank) const {
  ZRT_CHECK(mics_shard_size > 0, "replica_group_plan() without mics_shard_size");
  return replica_plan(world, mics_shard_size, rank);
}

SubgroupPlan ParallelDims::hpz_group_plan(int rank) const {
  ZRT_CHECK(hpz() > 0, "hpz_group_plan() without hpZ (stage {}, zero_hpz_partition_size {})", stage,
            hpz_partition_size);
  return shard_plan(world, hpz(), rank);
}

SubgroupPlan ParallelDims::sequence_parallel_plan(int rank) const {
  return shard_plan(world, sequence_parallel_size, rank);
}

SubgroupPlan ParallelDims::data_parallel_plan(int rank) const {
  return replica_plan(world, sequence_parallel_size, rank);
}

// Both expert plans index the data-parallel members of `rank` (position s = rank % sp in its sp
// block, data-parallel index d = rank / sp) and colour each group uniquely over the world.
SubgroupPlan ParallelDims::expert_parallel_plan(int rank) const {
  const int sp = sequence_parallel_size, ep = expert_parallel_size;
  const SubgroupPlan dp_group = data_parallel_plan(rank);  // checks rank and sp
  const int dp = data_parallel_size();
  ZRT_CHECK(ep >= 1 && dp % ep == 0,
            "expert_parallel_size {} does not divide the data-parallel degree {}", ep, dp);
  const int d = rank / sp, edp = dp / ep;
  SubgroupPlan plan;
  plan.key = rank;
  if (data_before_expert_parallel) {  // strided: d % edp, d % edp + edp, ...
    plan.color = (rank % sp) * edp + d % edp;
    for (int k = d % edp; k < dp; k += edp) {
      plan.members.push_back(dp_group.members[static_cast<std::size_t>(k)]);
    }
    return plan;
  }
  const int block = d / ep;
  plan.color = (rank % sp) * edp + block;
  for (int i = 0; i < ep; ++i) {
    plan.members.push_back(dp_group.members[static_cast<std::size_t>(block * ep + i)]);
  }
  return plan;
}

SubgroupPlan ParallelDims::expert_data_parallel_plan(int rank) const {
  const int sp = sequence_parallel_size, ep = expert_parallel_size;
  data_parallel_plan(rank);  // checks rank and sp
  const int dp = data_parallel_size();
  ZRT_CHECK(ep >= 1 && dp % ep == 0,
            "expert_parallel_size {} does not divide the data-parallel degree {}", ep, dp);
  const int d = rank / sp, edp = dp / ep;
  // The data-parallel indices that hold this rank's experts (consecutive blocks of edp with
  // data_before_expert_parallel, else every ep-th), each with every rank of its sp block: those
  // see other chunks of the same sequences, so an expert's gradient sums over them too.
  SubgroupPlan plan;
  plan.key = rank;
  plan.color = data_before_expert_parallel ? d / edp : d % ep;
  const int first = data_before_expert_parallel ? d / edp * edp : d % ep;
  const int step = data_before_expert_parallel ? 1 : ep;
  for (int i = 0, k = first; i < edp; ++i, k += step) {
    for (int s = 0; s < sp; ++s) plan.members.push_back(k * sp + s);
  }
  return plan;
}

int ParallelDims::expert_shard_world() const {
  return static_cast<int>(expert_shard_group_plan(0).members.size());
}

SubgroupPlan ParallelDims::expert_block_share(int rank, int block) const {
  const SubgroupPlan experts = expert_data_parallel_plan(rank);
  const int index = rank / block;
  SubgroupPlan plan;
  plan.key = rank;
  plan.color = index * world + experts.color;  // one group per block and expert set
  for (int member : experts.members) {
    if (member / block == index) plan.members.push_back(member);
  }
  return plan;
}

bool ParallelDims::expert_shares_even(int block, std::size_t* first, std::size_t* other) const {
  *first = expert_block_share(0, block).members.size();
  for (int rank = 1; rank < world; ++rank) {
    *other = expert_block_share(rank, block).members.size();
    if (*other != *first) return false;
  }
  return true;
}

SubgroupPlan ParallelDims::expert_hpz_group_plan(int rank) const {
  ZRT_CHECK(hpz() > 0, "expert_hpz_group_plan() without hpZ");
  return expert_block_share(rank, hpz());
}

SubgroupPlan ParallelDims::expert_shard_group_plan(int rank) const {
  return uses_mics() ? expert_block_share(rank, mics_shard_size) : expert_data_parallel_plan(rank);
}

// The members of the expert-data-parallel group are listed in rank order, so each block's share
// is a run of them; the replicas are the members at this rank's offset in every run.
SubgroupPlan ParallelDims::expert_replica_group_plan(int rank) const {
  const SubgroupPlan share = expert_shard_group_plan(rank);
  const SubgroupPlan experts = expert_data_parallel_plan(rank);
  const auto position = static_cast<std::size_t>(
      std::find(share.members.begin(), share.members.end(), rank) - share.members.begin());
  const std::size_t per_block = share.members.size();
  SubgroupPlan plan;
  plan.key = rank;
  plan.color = experts.color * world + static_cast<int>(position);
  for (std::size_t i = position; i < experts.members.size(); i += per_block) {
    plan.members.push_back(experts.members[i]);
  }
  return plan;
}

std::string ParallelDims::describe() const {
  std::string out = fmt::format("world {}", world);
  if (ranks_per_node > 0 && world % ranks_per_node == 0) {
    out += fmt::format(" ({} nodes x {})", world / ranks_per_node, ranks_per_node);
  }
  out += fmt::format(", stage {}", stage);
  if (sequence_parallel_size != 1) out += fmt::format(", sp {}", sequence_parallel_size);
  if (mics_shard_size > 0) out += fmt::format(", MiCS shards of {}", mics_shard_size);
  if (hpz_partition_size > 1) out += fmt::format(", hpZ groups of {}", hpz_partition_size);
  if (quantized()) {
    out += fmt::format(", {}{}", quantized_weights ? "qwZ" : "",
                       quantized_gradients ? (quantized_weights ? "+qgZ" : "qgZ") : "");
  }
  if (expert_parallel_size != 1) {
    out += fmt::format(", ep {}{}", expert_parallel_size,
                       data_before_expert_parallel ? " (data before expert)" : "");
  }
  return out;
}

}  // namespace zrt
