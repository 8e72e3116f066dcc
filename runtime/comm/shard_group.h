// ShardGroup: the groups one set of units of model state lives over — the group its slices are
// cut by (and its gradients reduce-scattered and its norm summed over), and the optional groups
// that refine it: MiCS's replicas (the ranks holding the same slices in the other shard groups),
// ZeRO++'s quantized collectives over the shard group, and hpZ's secondary-shard group.
//
// The engine holds a table of them (ZeroEngine's groups) and each unit names its entry
// (ParamSpec::group); today the table has one entry, the dense data-parallel group that
// ParallelLayout builds. Non-owning: the groups outlive whoever holds the table.
#pragma once

namespace zrt {

class ProcessGroup;
class QuantizedCollectives;

struct ShardGroup {
  ProcessGroup* shard = nullptr;  // required: the ranks a unit is sliced over
  // MiCS / HSDP: the ranks holding the same slices in the other shard groups; null (or a group
  // of one) when the state is sliced over every rank that holds a copy of these units.
  ProcessGroup* replicas = nullptr;
  QuantizedCollectives* quantized = nullptr;  // ZeRO++ qwZ / qgZ over `shard`, else null
  ProcessGroup* secondary = nullptr;          // ZeRO++ hpZ: this rank's S-rank group, else null
};

}  // namespace zrt
