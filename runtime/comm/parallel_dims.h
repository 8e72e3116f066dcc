// ParallelDims: the degrees of the parallel layout and the rank math that follows from them,
// pure (no MPI call), so that the trainer's layout (parallel_layout.h) and zrt-mem compute the
// same groups from the same numbers.
//
// The axes, outermost first, over `world` ranks laid out in nodes of `ranks_per_node`
// consecutive ranks (topology.h):
//   - sequence parallel (sp): blocks of sp consecutive ranks, which must lie within a node (a
//     sequence-parallel step exchanges activations every layer); the data-parallel degree is
//     world / sp, and the data-parallel group of a rank is the ranks at its position in every sp
//     block.
//   - ZeRO's data-parallel world: the dense units' state is sliced over the shard world
//     (shard_world()): 1 at stage 0, the MiCS shard group (mics_shard_size consecutive ranks,
//     replicated across the world / mics_shard_size groups) or the whole world. At any sp: the
//     ranks of an sp block hold the same parameters and reduce their chunks' gradients like
//     data-parallel ranks, so the shard and replica groups need not align with the sp blocks,
//     and mics_shard_size divides the world, not world / sp.
//   - ZeRO++ hpZ: secondary shards over blocks of hpz_partition_size consecutive ranks (stage 3,
//     within a node; a divisor of the world, like MiCS); qgZ/qwZ: the quantized collectives over
//     the shard group, hierarchical (intra-node, then inter-node) where it spans nodes.
//   - expert parallel (ep, expert_parallel.autoep_size): the data-parallel ranks in blocks of ep
//     consecutive ones, each holding a 1/ep share of every MoE layer's experts; an expert's
//     parameters are then data-parallel over the expert-data-parallel group (the ranks at the
//     same position in every ep block, and under sequence parallelism every rank of their sp
//     blocks, whose chunks route other tokens to the same experts). With
//     data_before_expert_parallel the roles swap: ep groups strided, expert-data-parallel
//     groups consecutive.
//
// validate() lists every inconsistency, each naming the config key and the fix; the subgroup
// plans are what make_subgroup() turns into groups.
//
// A value type: copy freely; thread-safe for concurrent reads.
#pragma once

#include <string>
#include <vector>

#include "runtime/comm/topology.h"

namespace zrt {

struct ParallelDims {
  int world = 1;
  // Ranks per node; 0: unknown (then nothing is checked against the nodes).
  int ranks_per_node = 0;
  int stage = 0;                     // zero_optimization.stage
  int mics_shard_size = 0;           // zero_optimization.mics_shard_size; 0: off
  int hpz_partition_size = 0;        // zero_optimization.zero_hpz_partition_size; 0 or 1: off
  bool quantized_weights = false;    // zero_quantized_weights (qwZ)
  bool quantized_gradients = false;  // zero_quantized_gradients (qgZ)
  int sequence_parallel_size = 1;
  int expert_parallel_size = 1;
  // use_data_before_expert_parallelism: the expert-parallel groups strided over the
  // data-parallel ranks (d, d + dp/ep, ...) and the expert-data-parallel groups consecutive
  // blocks of dp/ep, instead of the reverse (DeepSpeed's "D + E" rather than "E + D" order).
  bool data_before_expert_parallel = false;

  // Every problem with these degrees, as a sentence naming the config key and the fix; empty
  // when they are consistent.
  [[nodiscard]] std::vector<std::string> validate() const;
  // Throws InvalidArgument with every problem of validate(), one per line.
  void check() const;
  // The part of validate() that places the experts' groups in MiCS and hpZ blocks and ZeRO++'s
  // nodes, by config key (what the config reports at the key): empty unless the degrees
  // themselves are consistent enough to place them.
  struct KeyedProblem {
    std::string key;      // "zero_optimization.mics_shard_size"
    std::string message;  // the rest of the sentence, the fix included
  };
  [[nodiscard]] std::vector<KeyedProblem> expert_placement_problems() const;

  // Ranks that hold one copy of the model's dense data parallelism: world / sp.
  int data_parallel_size() const { return world / sequence_parallel_size; }
  // Ranks a dense unit's state is sliced over at `stage`: 1 at stage 0, the MiCS shard group,
  // or the whole world (every rank of every sp block: the parameters are the same on all).
  int shard_world(int stage) const;
  int shard_world() const { return shard_world(stage); }
  // How many shard groups hold the same slices (MiCS's replica count); 1 without MiCS.
  int replica_count() const { return world / shard_world(); }
  bool uses_mics() const { return stage >= 1 && mics_shard_size > 0; }
  // The hpZ group size in effect (stage 3 and a size above 1), else 0.
  int hpz() const { return stage == 3 && hpz_partition_size > 1 ? hpz_partition_size : 0; }
  bool quantized() const { return quantized_weights || quantized_gradients; }
  // The ranks holding the same experts: world / ep, the data-parallel ranks holding them and,
  // under sequence parallelism, every rank of their sp blocks.
  int expert_data_parallel_size() const { return world / expert_parallel_size; }
  // An expert's state is sliced over this many ranks: its expert-data-parallel group, or under
  // MiCS that group's ranks inside one shard block (validate() makes it the same for all).
  int expert_shard_world() const;

  // Whether blocks of `size` consecutive ranks tile the world with none spanning two nodes
  // (always true of the nodes where ranks_per_node is 0, unknown).
  bool blocks_within_nodes(int size) const;

  // ---- subgroup plans of world rank `rank` (parent: the world) ----
  // MiCS shard group: mics_shard_size consecutive ranks (needs uses_mics()).
  SubgroupPlan shard_group_plan(int rank) const;
  // MiCS replica group: the ranks at the same position in every shard group.
  SubgroupPlan replica_group_plan(int rank) const;
  // hpZ: this rank's block of hpz() consecutive ranks (needs hpz() > 0).
  SubgroupPlan hpz_group_plan(int rank) const;
  // Sequence parallel: this rank's block of sp consecutive ranks.
  SubgroupPlan sequence_parallel_plan(int rank) const;
  // Data parallel: the ranks at this rank's position in every sp block (the world at sp 1).
  SubgroupPlan data_parallel_plan(int rank) const;
  // Expert parallel: this rank's block of ep consecutive members of its data-parallel group.
  SubgroupPlan expert_parallel_plan(int rank) const;
  // Expert data parallel: the members of its data-parallel group at the same position in every
  // ep block (the data-parallel group at ep 1), with every rank of their sp blocks.
  SubgroupPlan expert_data_parallel_plan(int rank) const;
  // hpZ with expert parallelism: the ranks of `rank`'s expert-data-parallel group inside its hpZ
  // block (S consecutive ranks of a node): where its experts' secondary shards are kept.
  SubgroupPlan expert_hpz_group_plan(int rank) const;
  // The experts' shard group: with MiCS the ranks of `rank`'s expert-data-parallel group inside
  // its MiCS shard block, else that whole group; and (MiCS) those at the same position of that
  // share in every other block (the experts' replicas; `rank` alone without MiCS).
  SubgroupPlan expert_shard_group_plan(int rank) const;
  SubgroupPlan expert_replica_group_plan(int rank) const;

  // "world 8 (2 nodes x 4), stage 3, shards of 8" and the like, for logs.
  std::string describe() const;

 private:
  // The members of `rank`'s expert-data-parallel group inside its block of `block` consecutive
  // ranks (an hpZ or MiCS block), coloured by block and expert set.
  SubgroupPlan expert_block_share(int rank, int block) const;
  // Whether every block of `block` ranks holds as many ranks of each rank's expert-data-parallel
  // group: the sizes of the shares of rank 0 and of the first rank whose share differs.
  bool expert_shares_even(int block, std::size_t* first, std::size_t* other) const;
};

}  // namespace zrt
