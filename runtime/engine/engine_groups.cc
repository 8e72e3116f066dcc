// The engine's shard groups: their checks, the partition over them, and the slice this rank owns
// of each unit; and the engine's small questions about them (zero_engine.h).
#include "runtime/engine/engine_groups.h"

#include <cmath>

#include "runtime/common/error.h"
#include "runtime/engine/unit_placement.h"

namespace zrt {

namespace engine_groups {

namespace {

// hpZ's preconditions (EngineOptions::hpz_partition_size), with the fix in each message.
void check_hpz(const EngineOptions& options, const ProcessGroup& group,
               const ProcessGroup* replicas, const ProcessGroup* secondary) {
  const int S = options.hpz_partition_size;
  ZRT_CHECK(S >= 0, "zero_hpz_partition_size must be >= 1 (1: off), not {}", S);
  if (S <= 1) {
    ZRT_CHECK(secondary == nullptr || secondary->size() <= 1,
              "the engine was given a secondary (hpZ) group of {} ranks but "
              "zero_hpz_partition_size is {} (off)",
              secondary != nullptr ? secondary->size() : 0, S);
    return;
  }
  ZRT_CHECK(options.stage == 3,
            "zero_hpz_partition_size {} needs ZeRO stage 3 (stage is {}): hpZ keeps secondary "
            "shards of stage 3's gathered parameters; set stage 3 or zero_hpz_partition_size 1",
            S, options.stage);
  ZRT_CHECK(replicas == nullptr || replicas->size() <= 1,
            "zero_hpz_partition_size with mics_shard_size is not supported: MiCS already keeps "
            "every parameter gather inside the shard group; use one of them");
  ZRT_CHECK(group.size() % S == 0,
            "zero_hpz_partition_size {} does not divide the {} ranks the parameters are "
            "gathered over",
            S, group.size());
  ZRT_CHECK(secondary != nullptr && secondary->size() == S,
            "zero_hpz_partition_size is {} but the engine's secondary group has {} ranks: give "
            "it this rank's group of {} consecutive ranks (topology.h's shard_plan)",
            S, secondary != nullptr ? secondary->size() : 0, S);
  ZRT_CHECK(&secondary->stream() == &group.stream(),
            "the hpZ group issues on stream '{}' but the engine's group on '{}': both must use "
            "one communication stream",
            secondary->stream().name(), group.stream().name());
  const std::vector<int>& nodes = secondary->node_map();
  for (int node : nodes) {
    ZRT_CHECK(node == nodes.front(),
              "zero_hpz_partition_size {}: this rank's group of {} ranks spans nodes {} and {}, "
              "so the backward gathers would cross nodes; make it the ranks per node (or a "
              "divisor of it)",
              S, S, nodes.front(), node);
  }
}

}  // namespace

std::vector<ShardGroup> require_shard_groups(std::vector<ShardGroup> groups) {
  ZRT_CHECK(!groups.empty(), "the engine needs at least one shard group");
  for (std::size_t g = 0; g < groups.size(); ++g) {
    ZRT_CHECK(groups[g].shard != nullptr, "the engine's shard group {} has no process group", g);
  }
  return groups;
}

void check(const EngineOptions& options, const std::vector<ShardGroup>& groups) {
  const ShardGroup& dense = groups.front();
  const ProcessGroup& group = *dense.shard;
  const ProcessGroup* replicas = dense.replicas;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const ShardGroup& each = groups[g];
    ZRT_CHECK(&each.shard->stream() == &group.stream(),
              "the engine's shard group {} issues on stream '{}' but group 0 on '{}': every group "
              "must use one communication stream",
              g, each.shard->stream().name(), group.stream().name());
    ZRT_CHECK(each.replicas == nullptr || &each.replicas->stream() == &each.shard->stream(),
              "the replica group issues on stream '{}' but the shard group on '{}': hierarchical "
              "sharding needs both on one communication stream",
              each.replicas != nullptr ? each.replicas->stream().name() : "",
              each.shard->stream().name());
    ZRT_CHECK(each.norm_peers == nullptr || &each.norm_peers->stream() == &group.stream(),
              "the engine's shard group {} sums its norm over group '{}', which issues on stream "
              "'{}' and not on the engine's communication stream '{}'",
              g, each.norm_peers != nullptr ? each.norm_peers->name() : "",
              each.norm_peers != nullptr ? each.norm_peers->stream().name() : "",
              group.stream().name());
    ZRT_CHECK(each.gradient_scale > 0.0f && std::isfinite(each.gradient_scale),
              "the engine's shard group {} scales its gradients by {}: give a positive factor "
              "(1 / expert_parallel.autoep_size for expert units)",
              g, each.gradient_scale);
    ZRT_CHECK(each.replicas == nullptr || each.replicas->size() <= 1 || options.stage >= 1,
              "hierarchical sharding (a replica group) needs ZeRO stage 1, 2 or 3; stage 0 keeps "
              "no shards");
  }
  ZRT_CHECK(options.mics_shard_size <= 0 || options.mics_shard_size == group.size(),
            "mics_shard_size is {} but the engine's (shard) group has {} ranks: give the engine "
            "the shard group and the replica group (runtime/comm/topology.h's shard_plan and "
            "replica_plan)",
            options.mics_shard_size, group.size());
  const bool quantizes = options.quantized_weights || options.quantized_gradients;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    ZRT_CHECK(!quantizes || groups[g].quantized != nullptr,
              "zero_quantized_weights / zero_quantized_gradients need QuantizedCollectives over "
              "each shard group (runtime/comm/quantized_collectives.h); group {} has none",
              g);
  }
  ZRT_CHECK(!options.quantized_weights || options.stage == 3,
            "zero_quantized_weights quantizes stage 3's parameter gathers (stage is {})",
            options.stage);
  ZRT_CHECK(!options.quantized_gradients || options.stage >= 2,
            "zero_quantized_gradients quantizes the per-micro-batch reduce-scatter of stages 2-3 "
            "(stage is {})",
            options.stage);
  check_hpz(options, group, replicas, dense.secondary);
  // hpZ over the other groups: each keeps its secondary shards over its own ranks of an hpZ
  // block (ParallelLayout: the experts' expert-data-parallel ranks in it), within one node.
  for (std::size_t g = 1; g < groups.size(); ++g) {
    const ProcessGroup* secondary = groups[g].secondary;
    if (options.stage != 3 || options.hpz_partition_size <= 1) {
      ZRT_CHECK(secondary == nullptr || secondary->size() <= 1,
                "the engine's shard group {} has an hpZ group but zero_hpz_partition_size is {}", g,
                options.hpz_partition_size);
      continue;
    }
    ZRT_CHECK(secondary != nullptr && groups[g].shard->size() % secondary->size() == 0,
              "zero_hpz_partition_size {}: the engine's shard group {} ({} ranks) needs an hpZ "
              "group whose size divides it (ParallelLayout's expert_hpz_group), not {}",
              options.hpz_partition_size, g, groups[g].shard->size(),
              secondary != nullptr ? secondary->size() : 0);
    ZRT_CHECK(&secondary->stream() == &group.stream(),
              "the hpZ group of shard group {} issues on stream '{}' but group 0 on '{}'", g,
              secondary->stream().name(), group.stream().name());
    for (int node : secondary->node_map()) {
      ZRT_CHECK(node == secondary->node_map().front(),
                "the hpZ group of shard group {} spans nodes {} and {}: its backward gathers would "
                "cross them",
                g, secondary->node_map().front(), node);
    }
  }
}

PartitionOptions partition_options(const EngineOptions& options,
                                   const std::vector<ShardGroup>& groups, int num_modules) {
  return PartitionOptions{options.stage,
                          options.stage == 0 ? 1 : groups.front().shard->size(),
                          options.reduce_bucket_size,
                          options.stage == 3 ? options.stage3_param_persistence_threshold : 0,
                          options.alignment,
                          num_modules};
}

bool reduces_nothing(const std::vector<ShardGroup>& groups) {
  for (const ShardGroup& g : groups) {
    if (g.shard->size() > 1 || (g.replicas != nullptr && g.replicas->size() > 1) ||
        g.gradient_scale != 1.0f) {
      return false;
    }
  }
  return true;
}

std::vector<int> group_worlds(const EngineOptions& options, const std::vector<ShardGroup>& groups) {
  std::vector<int> worlds;
  for (const ShardGroup& g : groups) worlds.push_back(options.stage == 0 ? 1 : g.shard->size());
  return worlds;
}

ScheduleOptions schedule_options(const EngineOptions& options,
                                 const std::vector<ShardGroup>& groups, const PartitionPlan& plan,
                                 int num_modules) {
  ScheduleOptions s = zrt::schedule_options(options);
  s.gradient_buckets = per_micro_batch_grads(options, reduces_nothing(groups));
  if (options.model_stops_backward_early) {
    s.first_backward_module = UnitSchedule::lowest_trained_module(plan, num_modules);
  }
  for (const ShardGroup& g : groups) {
    s.hpz_group_sizes.push_back(hpz_secondary_ranks(
        options, g.shard->size(),
        g.secondary != nullptr ? g.secondary->size() : options.hpz_partition_size));
  }
  return s;
}

std::vector<int> unit_ranks(const PartitionPlan& plan, const EngineOptions& options,
                            const std::vector<ShardGroup>& groups) {
  std::vector<int> ranks;
  for (const Unit& unit : plan.units()) {
    ranks.push_back(
        options.stage == 0 ? 0 : groups[static_cast<std::size_t>(unit.group)].shard->rank());
  }
  return ranks;
}

}  // namespace engine_groups

bool ZeroEngine::sliced() const {
  if (options_.stage == 0) return false;
  for (const ShardGroup& g : groups_) {
    if (g.shard->size() > 1) return true;
  }
  return false;
}

ProcessGroup* ZeroEngine::replicas_of(int u) const {
  ProcessGroup* replicas = group_of(u).replicas;
  return replicas != nullptr && replicas->size() > 1 ? replicas : nullptr;
}

bool ZeroEngine::has_norm_peers() const {
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    if (norm_peers_of(g) != nullptr) return true;
  }
  return false;
}

ProcessGroup* ZeroEngine::norm_peers_of(std::size_t g) const {
  ProcessGroup* peers = groups_[g].norm_peers;
  return peers != nullptr && peers->size() > 1 ? peers : nullptr;
}

int ZeroEngine::state_rank() const {
  return options_.stage == 0 ? 0 : groups_.front().shard->rank();
}

}  // namespace zrt
