#include "runtime/comm/parallel_dims.h"

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
  } else if (dp_known && ep > 1 && nodes_known && quantized()) {
    // ZeRO++'s collectives over the experts' group run hierarchically over its nodes, which
    // must each hold as many of its ranks.
    for (int rank = 0; rank < world; ++rank) {
      std::vector<int> per_node(static_cast<std::size_t>(world / ranks_per_node), 0);
      for (int member : expert_data_parallel_plan(rank).members) {
        ++per_node[static_cast<std::size_t>(member / ranks_per_node)];
      }
      int first = 0;
      for (int count : per_node) first = first > 0 ? first : count;
      bool even = true;
      for (int count : per_node) even = even && (count == 0 || count == first);
      if (!even) {
        problems.push_back(fmt::format(
            "expert_parallel_size {} with zero_quantized_weights / zero_quantized_gradients: "
            "rank {}'s expert-data-parallel group has unequal numbers of ranks on its nodes "
            "({} ranks per node), and ZeRO++'s collectives over it run hierarchically by node; "
            "make expert_parallel_size divide the ranks per node",
            ep, rank, ranks_per_node));
        break;
      }
    }
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
  // hpZ with expert parallelism: the experts' secondary shards are kept over the ranks of their
  // expert-data-parallel group inside each hpZ block, as many in every block.
  if (ep > 1 && hpz() > 1 && dp_known && dp % ep == 0 && world % hpz() == 0) {
    std::size_t first = 0;
    for (int rank = 0; rank < world; ++rank) {
      const std::size_t size = expert_hpz_group_plan(rank).members.size();
      if (rank == 0) first = size;
      if (size != first) {
        problems.push_back(fmt::format(
            "zero_hpz_partition_size {} with expert_parallel_size {}: the hpZ blocks hold "
            "unequal numbers of ranks of an expert-data-parallel group ({} and {}), and each "
            "expert's secondary shards are kept over those; make expert_parallel_size divide "
            "zero_hpz_partition_size",
            hpz(), ep, first, size));
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

SubgroupPlan ParallelDims::expert_hpz_group_plan(int rank) const {
  const int S = hpz();
  ZRT_CHECK(S > 0, "expert_hpz_group_plan() without hpZ");
  const SubgroupPlan experts = expert_data_parallel_plan(rank);
  const int block = rank / S;
  SubgroupPlan plan;
  plan.key = rank;
  plan.color = block * world + experts.color;  // one group per block and expert set
  for (int member : experts.members) {
    if (member / S == block) plan.members.push_back(member);
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
