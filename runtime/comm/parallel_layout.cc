#include "runtime/comm/parallel_layout.h"

#include <algorithm>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "runtime/common/error.h"

namespace zrt {

ParallelLayout::ParallelLayout(Device& device, MPI_Comm world, Stream& comm, Stream& control,
                               const ParallelDims& dims, const CommOptions& comm_options,
                               Stream* sequence)
    : dims_(dims) {
  int size = 0;
  MPI_Comm_size(world, &size);
  ZRT_CHECK(dims.world == size, "the parallel layout is for {} ranks but the communicator has {}",
            dims.world, size);
  ZRT_CHECK(dims.sequence_parallel_size <= 1 || sequence != nullptr,
            "sequence_parallel_size {} without a stream for its all-to-alls",
            dims.sequence_parallel_size);
  world_group_ = make_process_group(device, world, comm, "zero", comm_options);
  control_group_ = make_process_group(device, world, control, "control", comm_options);
  const int rank = world_group_->rank();
  // Which node each rank is on (comm.ranks_per_node simulates nodes): the byte counters split
  // the traffic by it. A layout NodeTopology refuses ends the run only where nodes were asked
  // for; otherwise every rank counts as one node.
  try {
    topology_ = NodeTopology::detect(world, dims.ranks_per_node);
    world_group_->set_node_map(topology_->node_map());
    control_group_->set_node_map(topology_->node_map());
    dims_.ranks_per_node = topology_->ranks_per_node();
    if (rank == 0) spdlog::info("node topology: {}", topology_->describe());
  } catch (const Error& e) {
    if (dims.ranks_per_node > 0) throw;
    dims_.ranks_per_node = 0;
    if (rank == 0) {
      spdlog::warn("node topology: {}; counting every rank as one node", e.what());
    }
  }
  dims_.check();

  // Hierarchical sharding (zero_optimization.mics_shard_size): the engine slices the state over
  // this rank's shard group and averages each gradient slice over its replicas; both groups
  // issue on the engine's communication stream.
  if (dims_.uses_mics()) {
    shard_group_ = make_subgroup(*world_group_, dims_.shard_group_plan(rank), comm, "zero-shards");
    replica_group_ =
        make_subgroup(*world_group_, dims_.replica_group_plan(rank), comm, "zero-replicas");
    if (rank == 0) {
      spdlog::info(
          "hierarchical sharding: state sliced over {} groups of {} ranks, replicated "
          "across them",
          dims_.world / dims_.mics_shard_size, dims_.mics_shard_size);
    }
  }
  // ZeRO++ (zero_quantized_weights / zero_quantized_gradients): the quantized collectives over
  // the sharding group, hierarchical where it spans several nodes.
  if (dims_.quantized()) {
    quantized_ = make_quantized(device, shard_group(), comm, "zero", &intra_group_, &inter_group_);
  }
  // ZeRO++ hpZ (zero_optimization.zero_hpz_partition_size S): secondary shards over this rank's
  // block of S consecutive ranks. The engine refuses a block that spans two nodes of the
  // topology (the backward gathers would cross them).
  if (dims_.hpz_partition_size > 1) {
    hpz_group_ = make_subgroup(*world_group_, dims_.hpz_group_plan(rank), comm, "zero-hpz");
    if (rank == 0) {
      spdlog::info(
          "hpZ: secondary shards over {} groups of {} ranks; backward gathers stay inside them",
          dims_.world / dims_.hpz_partition_size, dims_.hpz_partition_size);
    }
  }
  // Expert parallelism (expert_parallel.autoep_size): the tokens' all-to-alls run over the
  // expert-parallel group, the experts' state over the expert-data-parallel group; both issue
  // on the engine's communication stream, in the order the model and the engine issue them.
  if (dims_.expert_parallel_size > 1) {
    expert_group_ =
        make_subgroup(*world_group_, dims_.expert_parallel_plan(rank), comm, "expert-parallel");
    expert_data_group_ = make_subgroup(*world_group_, dims_.expert_data_parallel_plan(rank), comm,
                                       "expert-data-parallel");
    // MiCS: the experts' state sliced over their expert-data-parallel ranks inside this rank's
    // shard block, their gradients averaged again over the same share of the other blocks.
    if (dims_.uses_mics()) {
      expert_shard_group_ =
          make_subgroup(*world_group_, dims_.expert_shard_group_plan(rank), comm, "expert-shards");
      expert_replica_group_ = make_subgroup(*world_group_, dims_.expert_replica_group_plan(rank),
                                            comm, "expert-replicas");
    }
    // ZeRO++ over the experts' units too: their slices are gathered and their gradients
    // reduce-scattered over their shard group, which may span nodes as the dense group does.
    if (dims_.quantized()) {
      expert_quantized_ = make_quantized(device, expert_shard_group(), comm, "expert",
                                         &expert_intra_group_, &expert_inter_group_);
    }
    // hpZ: the experts' secondary shards over their expert-data-parallel ranks of this rank's
    // hpZ block (within a node, as the block is).
    if (dims_.hpz() > 1) {
      expert_hpz_group_ =
          make_subgroup(*world_group_, dims_.expert_hpz_group_plan(rank), comm, "expert-hpz");
    }
    if (rank == 0) {
      const int holders = dims_.expert_data_parallel_size();
      std::string state = fmt::format("sliced over {} ranks", holders);
      if (dims_.stage == 0) {
        state = fmt::format("whole on its {} ranks (stage 0: its gradients all-reduced over them)",
                            holders);
      } else if (dims_.uses_mics()) {
        state = fmt::format(
            "sliced over {} of its {} expert-data-parallel ranks (those in a MiCS shard group), "
            "{} copies",
            dims_.expert_shard_world(), holders, holders / dims_.expert_shard_world());
      }
      spdlog::info(
          "expert parallelism: experts split over {} groups of {} ranks, each expert's "
          "state {}",
          dims_.world / dims_.expert_parallel_size, dims_.expert_parallel_size, state);
    }
  }
  // Ulysses sequence parallelism: this rank's block of sp consecutive ranks, within a node
  // (dims_.check() refused a block spanning two); the model's all-to-alls run on it.
  if (dims_.sequence_parallel_size > 1) {
    sequence_group_ = make_subgroup(*world_group_, dims_.sequence_parallel_plan(rank), *sequence,
                                    "sequence-parallel");
    if (rank == 0) {
      spdlog::info(
          "sequence parallelism: {} groups of {} consecutive ranks, each sequence in {} chunks; "
          "data-parallel degree {}",
          dims_.data_parallel_size(), dims_.sequence_parallel_size, dims_.sequence_parallel_size,
          dims_.data_parallel_size());
    }
  }
}

std::unique_ptr<QuantizedCollectives> ParallelLayout::make_quantized(
    Device& device, ProcessGroup& sharding, Stream& comm, const std::string& name,
    std::unique_ptr<ProcessGroup>* intra, std::unique_ptr<ProcessGroup>* inter) {
  const std::vector<int>& nodes = sharding.node_map();
  const bool several_nodes = !nodes.empty() && std::any_of(nodes.begin(), nodes.end(), [&](int n) {
    return n != nodes.front();
  });
  if (several_nodes) {
    *intra = make_subgroup(sharding, intra_node_plan(nodes, sharding.rank()), comm,
                           name + "-intra-node");
    *inter = make_subgroup(sharding, inter_node_plan(nodes, sharding.rank()), comm,
                           name + "-inter-node");
  }
  return std::make_unique<QuantizedCollectives>(device, sharding, intra->get(), inter->get());
}

std::vector<ShardGroup> ParallelLayout::engine_groups() {
  std::vector<ShardGroup> groups{
      ShardGroup{&shard_group(), replica_group_.get(), quantized_.get(), hpz_group_.get()}};
  if (expert_group_) {
    // [1] the experts' units: sliced and reduced over the ranks holding the same experts, their
    // norm summed over the ranks holding the others, their averaged gradients times 1 / ep.
    ShardGroup experts{&expert_shard_group()};
    experts.replicas = expert_replica_group_.get();
    experts.quantized = expert_quantized_.get();
    experts.secondary = expert_hpz_group_.get();
    experts.norm_peers = expert_group_.get();
    experts.gradient_scale = 1.0f / static_cast<float>(dims_.expert_parallel_size);
    groups.push_back(experts);
  }
  return groups;
}

CommCounts ParallelLayout::sequence_traffic() const {
  return sequence_group_ ? sequence_group_->stats().snapshot() : CommCounts{};
}

CommCounts ParallelLayout::engine_traffic() const {
  CommCounts c = world_group_->stats().snapshot();
  for (const ProcessGroup* g :
       {shard_group_.get(), replica_group_.get(), intra_group_.get(), inter_group_.get(),
        hpz_group_.get(), expert_group_.get(), expert_data_group_.get(), expert_shard_group_.get(),
        expert_replica_group_.get(), expert_intra_group_.get(), expert_inter_group_.get(),
        expert_hpz_group_.get()}) {
    if (g != nullptr) c += g->stats().snapshot();
  }
  return c;
}

}  // namespace zrt
