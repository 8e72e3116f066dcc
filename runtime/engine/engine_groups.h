// The engine's table of shard groups (shard_group.h), checked: what each group must be for the
// options, how the units are sliced over them, and the slice this rank owns of each unit.
// Private to the engine (zero_engine.cc builds its members with them).
#pragma once

#include <vector>

#include "runtime/comm/shard_group.h"
#include "runtime/engine/partition.h"
#include "runtime/engine/zero_engine.h"

namespace zrt::engine_groups {

// `groups`, once it has at least one entry and every entry a shard group. Throws
// InvalidArgument otherwise.
std::vector<ShardGroup> require_shard_groups(std::vector<ShardGroup> groups);
// Every other precondition on the groups for `options` (one communication stream; MiCS, qgZ/qwZ
// and hpZ on the first group as the options ask; what several groups do not support yet), with
// the fix in each message. Throws InvalidArgument.
void check(const EngineOptions& options, const std::vector<ShardGroup>& groups);
// The partition over the groups: group 0's options, and each group's world, its shard group's
// size (1 at stage 0).
PartitionOptions partition_options(const EngineOptions& options,
                                   const std::vector<ShardGroup>& groups, int num_modules);
std::vector<int> group_worlds(const EngineOptions& options, const std::vector<ShardGroup>& groups);
// Whether no other rank shares this rank's gradients: every group's shard group is this rank
// alone, with no replicas and no scaling (per_micro_batch_grads in engine_options.h).
bool reduces_nothing(const std::vector<ShardGroup>& groups);
// The schedule's options (engine_options.h's schedule_options), with each group's hpZ size: its
// secondary group's ranks (hpz_partition_size where it has none; none at all where its units
// are read in place: unit_placement.h's hpz_secondary_ranks), where the backward ends for
// `plan` (EngineOptions::model_stops_backward_early), and whether stages 2-3 bucket the
// gradients (per_micro_batch_grads).
ScheduleOptions schedule_options(const EngineOptions& options,
                                 const std::vector<ShardGroup>& groups, const PartitionPlan& plan,
                                 int num_modules);
// Per unit of `plan`: this rank's slice of it (its rank in the unit's shard group; 0 at stage 0).
std::vector<int> unit_ranks(const PartitionPlan& plan, const EngineOptions& options,
                            const std::vector<ShardGroup>& groups);

}  // namespace zrt::engine_groups
