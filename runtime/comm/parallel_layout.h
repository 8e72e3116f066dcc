// ParallelLayout: every process group of a run, built once from ParallelDims (parallel_dims.h)
// — the world ("zero") group the engine's collectives start from, the control group (its own
// communicator and stream, for the trainer's small collectives and the checkpointer), the node
// topology, MiCS's shard and replica groups, ZeRO++'s intra/inter-node groups and quantized
// collectives, hpZ's secondary-shard group, expert parallelism's expert-parallel and
// expert-data-parallel groups (and the experts' MiCS shard and replica groups), and the
// sequence-parallel group (Ulysses' all-to-alls, on a stream of its own). Other modules ask it for
// a group by role instead of splitting their own; a new axis is a new plan in ParallelDims and a
// new group here.
//
// Construction is collective over `world` (every rank builds the same groups in the same
// order). Thread-safety: one thread builds and uses it, like the groups it owns.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <mpi.h>

#include "runtime/comm/comm_stats.h"
#include "runtime/comm/parallel_dims.h"
#include "runtime/comm/process_group.h"
#include "runtime/comm/quantized_collectives.h"
#include "runtime/comm/shard_group.h"
#include "runtime/comm/topology.h"

namespace zrt {

class Device;
class Stream;

class ParallelLayout {
 public:
  // Builds the groups `dims` asks for over `world` (dims.world must be its size;
  // dims.ranks_per_node > 0 simulates nodes as comm.ranks_per_node does, 0 detects them). The
  // engine's groups issue on `comm`, the control group on `control`; both must outlive the
  // layout. The sequence-parallel group (sequence_parallel_size above 1) issues on `sequence`,
  // which must then be given and outlive the layout: the model's all-to-alls need their own
  // stream, so they never queue behind the engine's gathers and reductions. A node layout
  // NodeTopology refuses ends the run only where nodes were asked for; otherwise every rank
  // counts as one node. Throws InvalidArgument listing dims' problems (ParallelDims::validate(),
  // with the detected ranks per node). Whether the model has experts for expert_parallel_size
  // above 1 is the trainer's check (the layout does not know the model).
  ParallelLayout(Device& device, MPI_Comm world, Stream& comm, Stream& control,
                 const ParallelDims& dims, const CommOptions& comm_options,
                 Stream* sequence = nullptr);
  ParallelLayout(const ParallelLayout&) = delete;
  ParallelLayout& operator=(const ParallelLayout&) = delete;

  // The degrees, with ranks_per_node as detected (0 where the nodes could not be told apart).
  const ParallelDims& dims() const { return dims_; }
  int rank() const { return world_group_->rank(); }
  // The node layout, when detected or simulated.
  const std::optional<NodeTopology>& topology() const { return topology_; }

  // ---- the groups by role ----
  ProcessGroup& world_group() { return *world_group_; }  // every rank ("zero")
  ProcessGroup& control_group() { return *control_group_; }
  // The dense units' shard group: MiCS's shard group, or the world.
  ProcessGroup& shard_group() { return shard_group_ ? *shard_group_ : *world_group_; }
  ProcessGroup* replica_group() { return replica_group_.get(); }   // MiCS, else null
  ProcessGroup* intra_node_group() { return intra_group_.get(); }  // qgZ over nodes
  ProcessGroup* inter_node_group() { return inter_group_.get(); }  // qgZ over nodes
  QuantizedCollectives* quantized() { return quantized_.get(); }   // qwZ / qgZ, else null
  ProcessGroup* hpz_group() { return hpz_group_.get(); }           // hpZ, else null
  // Expert parallelism (expert_parallel_size > 1), else null: the ranks that split the experts
  // (the tokens' all-to-alls) and the ranks holding the same experts (their state).
  ProcessGroup* expert_parallel_group() { return expert_group_.get(); }
  ProcessGroup* expert_data_parallel_group() { return expert_data_group_.get(); }
  // The experts' shard group: the expert-data-parallel group, or under MiCS its ranks inside
  // this rank's shard block (needs expert parallelism); their MiCS replicas, else null.
  ProcessGroup& expert_shard_group() {
    return expert_shard_group_ ? *expert_shard_group_ : *expert_data_group_;
  }
  ProcessGroup* expert_replica_group() { return expert_replica_group_.get(); }
  // ZeRO++ over the experts' units: the quantized collectives over their shard group
  // (hierarchical where it spans nodes), else null.
  QuantizedCollectives* expert_quantized() { return expert_quantized_.get(); }
  // hpZ over the experts' units: their expert-data-parallel ranks in this rank's hpZ block.
  ProcessGroup* expert_hpz_group() { return expert_hpz_group_.get(); }
  // This rank's block of sequence_parallel_size consecutive ranks (one node), issuing on the
  // `sequence` stream; null at sequence_parallel_size 1. The model's, not the engine's.
  ProcessGroup* sequence_group() { return sequence_group_.get(); }

  // The engine's table of shard groups (ZeroEngine, ParamSpec::group): [0] the dense units';
  // with expert parallelism [1] the experts' (ShardGroup: their shard group and MiCS replicas,
  // their quantized collectives under ZeRO++ and hpZ group, the expert-parallel group as norm
  // peers, gradient_scale 1 / ep).
  std::vector<ShardGroup> engine_groups();
  // The engine's traffic so far, summed over every group it uses (and the world group).
  CommCounts engine_traffic() const;
  // The model's sequence-parallel all-to-alls so far (zero at sequence_parallel_size 1).
  CommCounts sequence_traffic() const;

 private:
  // QuantizedCollectives over `sharding`, with its intra- and inter-node subgroups (made into
  // `intra` / `inter`, named after `name`) where it spans several nodes.
  static std::unique_ptr<QuantizedCollectives> make_quantized(Device& device,
                                                              ProcessGroup& sharding, Stream& comm,
                                                              const std::string& name,
                                                              std::unique_ptr<ProcessGroup>* intra,
                                                              std::unique_ptr<ProcessGroup>* inter);

  ParallelDims dims_;
  std::optional<NodeTopology> topology_;
  std::unique_ptr<ProcessGroup> world_group_;
  std::unique_ptr<ProcessGroup> control_group_;
  std::unique_ptr<ProcessGroup> shard_group_, replica_group_;
  std::unique_ptr<ProcessGroup> intra_group_, inter_group_;
  std::unique_ptr<QuantizedCollectives> quantized_;
  std::unique_ptr<ProcessGroup> hpz_group_;
  std::unique_ptr<ProcessGroup> expert_group_, expert_data_group_;
  std::unique_ptr<ProcessGroup> expert_shard_group_, expert_replica_group_;  // MiCS
  std::unique_ptr<ProcessGroup> expert_intra_group_, expert_inter_group_, expert_hpz_group_;
  std::unique_ptr<QuantizedCollectives> expert_quantized_;
  std::unique_ptr<ProcessGroup> sequence_group_;
};

}  // namespace zrt
