// Which node each rank lives on, and the sub-groups built from it.
//
// zrt lays nodes out as blocks of consecutive ranks, as mpirun places them by default
// (--map-by slot): with L ranks per node, rank r is on node r / L and has local rank r % L, and
// every node holds the same number of ranks. NodeTopology::detect() reads the layout from MPI
// (MPI_Comm_split_type shared-memory groups), checks it against the host names
// (MPI_Get_processor_name) and refuses any other layout with the fix; CommOptions::ranks_per_node
// (config key comm.ranks_per_node) replaces it so that one machine can act as several nodes in
// tests.
//
// The sub-group plans are pure functions of a node map (the node of each rank of a parent
// group), so they are tested without MPI; make_subgroup() turns a plan into a group by
// ProcessGroup::split (MPI_Comm_split or ncclCommSplit) and gives the child its node map, which
// its byte counters use (comm_stats.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <mpi.h>

namespace zrt {

class ProcessGroup;
class Stream;

class NodeTopology {
 public:
  // world_size ranks in nodes of ranks_per_node consecutive ranks. Throws InvalidArgument
  // unless ranks_per_node >= 1 divides world_size.
  NodeTopology(int world_size, int ranks_per_node);

  // Collective over comm. From MPI's shared-memory groups, checked against the host names;
  // ranks_per_node_override > 0 replaces the detected layout (it must divide the world size and
  // the detected ranks per node, so that every simulated node lies within one real node).
  // Throws Error naming the ranks and hosts when MPI and the host names disagree, or when the
  // layout is not blocks of consecutive ranks of equal size.
  static NodeTopology detect(MPI_Comm comm, int ranks_per_node_override = 0);

  // The checks of detect() on gathered data (pure, for tests): group_of_rank[r] names rank r's
  // shared-memory group (any id, equal within a group), hosts[r] its host name.
  static NodeTopology from_groups(const std::vector<int>& group_of_rank,
                                  const std::vector<std::string>& hosts);

  int world_size() const { return world_size_; }
  int ranks_per_node() const { return ranks_per_node_; }
  int node_count() const { return world_size_ / ranks_per_node_; }
  int node_of(int rank) const { return rank / ranks_per_node_; }
  int local_rank(int rank) const { return rank % ranks_per_node_; }
  bool same_node(int a, int b) const { return node_of(a) == node_of(b); }
  // node_of(r) for every rank: the node map of a group over the whole world.
  std::vector<int> node_map() const;
  // "2 nodes x 4 ranks".
  std::string describe() const;

 private:
  int world_size_;
  int ranks_per_node_;
};

// A sub-group of a parent group: the colour and key ProcessGroup::split takes, and the members
// (parent ranks) in the sub-group's rank order.
struct SubgroupPlan {
  int color = 0;
  int key = 0;
  std::vector<int> members;
};

// Plans from the parent's node map (node of each parent rank) for parent rank `rank`.
// Ranks on `rank`'s node, in parent order.
SubgroupPlan intra_node_plan(const std::vector<int>& node_map, int rank);
// One rank per node: those with the same position among their node's ranks as `rank` (nodes
// must hold equally many ranks of the parent).
SubgroupPlan inter_node_plan(const std::vector<int>& node_map, int rank);
// MiCS shard groups: shard_size consecutive parent ranks ([k*S, (k+1)*S) holds rank).
SubgroupPlan shard_plan(int parent_size, int shard_size, int rank);
// MiCS replica groups: the ranks at the same position in every shard group (r % S equal).
SubgroupPlan replica_plan(int parent_size, int shard_size, int rank);

// Creates the sub-group `plan` describes (collective over parent: every parent rank calls it,
// each with its own plan, in the same order), issuing on `stream`, with its node map taken from
// the parent's. Checks that the group MPI/NCCL made has the planned size and rank.
std::unique_ptr<ProcessGroup> make_subgroup(ProcessGroup& parent, const SubgroupPlan& plan,
                                            Stream& stream, const std::string& name);

}  // namespace zrt
