#include "runtime/comm/topology.h"

#include <algorithm>
#include <cstring>
#include <map>

#include <spdlog/spdlog.h>

#include "runtime/comm/mpi_runtime.h"
#include "runtime/comm/process_group.h"
#include "runtime/common/error.h"

namespace zrt {

NodeTopology::NodeTopology(int world_size, int ranks_per_node)
    : world_size_(world_size), ranks_per_node_(ranks_per_node) {
  if (world_size < 1 || ranks_per_node < 1 || world_size % ranks_per_node != 0) {
    ZRT_THROW(InvalidArgument,
              "{} ranks cannot form nodes of {} ranks each (comm.ranks_per_node must divide the "
              "number of ranks)",
              world_size, ranks_per_node);
  }
}

std::vector<int> NodeTopology::node_map() const {
  std::vector<int> nodes(static_cast<std::size_t>(world_size_));
  for (int r = 0; r < world_size_; ++r) nodes[static_cast<std::size_t>(r)] = node_of(r);
  return nodes;
}

std::string NodeTopology::describe() const {
  return fmt::format("{} node{} x {} rank{}", node_count(), node_count() == 1 ? "" : "s",
                     ranks_per_node_, ranks_per_node_ == 1 ? "" : "s");
}

NodeTopology NodeTopology::from_groups(const std::vector<int>& group_of_rank,
                                       const std::vector<std::string>& hosts) {
  const int world = static_cast<int>(group_of_rank.size());
  ZRT_CHECK(world >= 1 && hosts.size() == group_of_rank.size(),
            "{} shared-memory group ids but {} host names", world, hosts.size());
  // MPI's shared-memory groups and the host names must name the same nodes: two host names in
  // one group, or one host name in two groups, means MPI and the system disagree about which
  // ranks share a machine (e.g. two hosts with the same name: OpenMPI then treats them as one).
  std::map<int, int> first_of_group;
  std::map<std::string, int> first_of_host;
  for (int r = 0; r < world; ++r) {
    const auto g = first_of_group.emplace(group_of_rank[r], r).first->second;
    const auto h = first_of_host.emplace(hosts[r], r).first->second;
    if (hosts[g] != hosts[r]) {
      ZRT_THROW(Error,
                "node topology: ranks {} and {} share memory (one MPI node) but run on hosts "
                "'{}' and '{}'; give every host its own name and check the launcher's host list",
                g, r, hosts[g], hosts[r]);
    }
    if (group_of_rank[h] != group_of_rank[r]) {
      ZRT_THROW(Error,
                "node topology: ranks {} and {} run on hosts of the same name '{}' but MPI puts "
                "them on different nodes; every host needs a distinct host name (OpenMPI "
                "identifies nodes by name)",
                h, r, hosts[r]);
    }
  }
  // Blocks of consecutive ranks, all of one size.
  const auto per_node =
      static_cast<int>(std::count(group_of_rank.begin(), group_of_rank.end(), group_of_rank[0]));
  for (int r = 0; r < world; ++r) {
    const int first = (r / per_node) * per_node;
    if (world % per_node != 0 || group_of_rank[r] != group_of_rank[first]) {
      ZRT_THROW(Error,
                "node topology: ranks are not placed in blocks of {} consecutive ranks per node "
                "(rank {} is on host '{}', rank {} on '{}'); launch every node with the same "
                "number of ranks, placed by slot (mpirun's default --map-by slot)",
                per_node, r, hosts[r], first < world ? first : 0, hosts[first < world ? first : 0]);
    }
  }
  return NodeTopology(world, per_node);
}

NodeTopology NodeTopology::detect(MPI_Comm comm, int ranks_per_node_override) {
  int rank = 0;
  int world = 1;
  ZRT_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  ZRT_MPI_CHECK(MPI_Comm_size(comm, &world));
  // Each shared-memory group is named by the lowest rank in it.
  MPI_Comm node = MPI_COMM_NULL;
  ZRT_MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
  int leader = rank;
  const int leader_code = MPI_Allreduce(MPI_IN_PLACE, &leader, 1, MPI_INT, MPI_MIN, node);
  MPI_Comm_free(&node);
  ZRT_MPI_CHECK(leader_code);
  std::vector<int> groups(static_cast<std::size_t>(world));
  ZRT_MPI_CHECK(MPI_Allgather(&leader, 1, MPI_INT, groups.data(), 1, MPI_INT, comm));

  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int length = 0;
  ZRT_MPI_CHECK(MPI_Get_processor_name(name, &length));
  std::vector<char> names(static_cast<std::size_t>(world) * MPI_MAX_PROCESSOR_NAME);
  ZRT_MPI_CHECK(MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(),
                              MPI_MAX_PROCESSOR_NAME, MPI_CHAR, comm));
  std::vector<std::string> hosts;
  for (int r = 0; r < world; ++r) {
    const char* p = names.data() + static_cast<std::size_t>(r) * MPI_MAX_PROCESSOR_NAME;
    hosts.emplace_back(p, strnlen(p, MPI_MAX_PROCESSOR_NAME));
  }
  const NodeTopology real = from_groups(groups, hosts);
  if (ranks_per_node_override <= 0) return real;
  if (real.ranks_per_node() % ranks_per_node_override != 0) {
    ZRT_THROW(InvalidArgument,
              "comm.ranks_per_node {} does not divide the {} ranks per node MPI reports ({}): "
              "simulated nodes must lie within real ones",
              ranks_per_node_override, real.ranks_per_node(), real.describe());
  }
  NodeTopology simulated(world, ranks_per_node_override);
  if (rank == 0 && ranks_per_node_override != real.ranks_per_node()) {
    spdlog::info("node topology: {} simulated by comm.ranks_per_node (MPI reports {})",
                 simulated.describe(), real.describe());
  }
  return simulated;
}

// ---- sub-group plans ---------------------------------------------------------------------------

namespace {

void check_rank(int size, int rank) {
  ZRT_CHECK(rank >= 0 && rank < size, "rank {} outside a group of {}", rank, size);
}

// Position of each rank among its node's ranks, and how many ranks each node holds.
std::vector<int> positions_on_node(const std::vector<int>& node_map, std::map<int, int>* counts) {
  std::vector<int> position(node_map.size());
  for (std::size_t r = 0; r < node_map.size(); ++r) position[r] = (*counts)[node_map[r]]++;
  return position;
}

}  // namespace

SubgroupPlan intra_node_plan(const std::vector<int>& node_map, int rank) {
  check_rank(static_cast<int>(node_map.size()), rank);
  SubgroupPlan plan;
  const int node = node_map[static_cast<std::size_t>(rank)];
  ZRT_CHECK(node >= 0, "node ids must be >= 0, not {}", node);
  plan.color = node;
  plan.key = rank;
  for (std::size_t r = 0; r < node_map.size(); ++r) {
    if (node_map[r] == node) plan.members.push_back(static_cast<int>(r));
  }
  return plan;
}

SubgroupPlan inter_node_plan(const std::vector<int>& node_map, int rank) {
  check_rank(static_cast<int>(node_map.size()), rank);
  std::map<int, int> counts;
  const std::vector<int> position = positions_on_node(node_map, &counts);
  for (const auto& [node, n] : counts) {
    ZRT_CHECK(n == counts.begin()->second,
              "inter-node groups need equally many ranks on every node; node {} has {}, node {} "
              "has {}",
              counts.begin()->first, counts.begin()->second, node, n);
  }
  SubgroupPlan plan;
  plan.color = position[static_cast<std::size_t>(rank)];
  plan.key = rank;
  for (std::size_t r = 0; r < node_map.size(); ++r) {
    if (position[r] == plan.color) plan.members.push_back(static_cast<int>(r));
  }
  return plan;
}

SubgroupPlan shard_plan(int parent_size, int shard_size, int rank) {
  check_rank(parent_size, rank);
  if (shard_size < 1 || parent_size % shard_size != 0) {
    ZRT_THROW(InvalidArgument, "shard groups of {} ranks do not divide {} ranks", shard_size,
              parent_size);
  }
  SubgroupPlan plan;
  plan.color = rank / shard_size;
  plan.key = rank;
  for (int i = 0; i < shard_size; ++i) plan.members.push_back(plan.color * shard_size + i);
  return plan;
}

SubgroupPlan replica_plan(int parent_size, int shard_size, int rank) {
  check_rank(parent_size, rank);
  if (shard_size < 1 || parent_size % shard_size != 0) {
    ZRT_THROW(InvalidArgument, "shard groups of {} ranks do not divide {} ranks", shard_size,
              parent_size);
  }
  SubgroupPlan plan;
  plan.color = rank % shard_size;
  plan.key = rank;
  for (int r = plan.color; r < parent_size; r += shard_size) plan.members.push_back(r);
  return plan;
}

std::unique_ptr<ProcessGroup> make_subgroup(ProcessGroup& parent, const SubgroupPlan& plan,
                                            Stream& stream, const std::string& name) {
  const auto me = std::find(plan.members.begin(), plan.members.end(), parent.rank());
  ZRT_CHECK(me != plan.members.end(), "sub-group '{}': rank {} of '{}' is not among its members",
            name, parent.rank(), parent.name());
  // The split is a collective of the parent's ranks: the sequence check agrees on it first, then
  // gives the child a check of its own over the same members.
  std::unique_ptr<CollectiveSequenceCheck> child_check;
  if (CollectiveSequenceCheck* check = parent.sequence_check()) {
    check->verify(fmt::format("split into '{}'", name));
    child_check = check->split(plan.color, plan.key, name);
  }
  std::unique_ptr<ProcessGroup> child = parent.split(plan.color, plan.key, stream, name);
  child->set_sequence_check(std::move(child_check));
  const auto expected_rank = static_cast<int>(me - plan.members.begin());
  ZRT_CHECK(
      child->size() == static_cast<int>(plan.members.size()) && child->rank() == expected_rank,
      "sub-group '{}' of '{}' came out as rank {} of {}, planned rank {} of {} (ranks "
      "planned different groups?)",
      name, parent.name(), child->rank(), child->size(), expected_rank, plan.members.size());
  std::vector<int> nodes;
  for (int member : plan.members) {
    nodes.push_back(parent.node_map()[static_cast<std::size_t>(member)]);
  }
  child->set_node_map(std::move(nodes));
  return child;
}

}  // namespace zrt
