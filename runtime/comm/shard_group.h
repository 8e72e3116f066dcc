// ShardGroup: the groups one set of units of model state lives over — the group its slices are
// cut by (and its gradients reduce-scattered and its norm summed over), and the optional groups
// that refine it: MiCS's replicas (the ranks holding the same slices in the other shard groups),
// ZeRO++'s quantized collectives over the shard group, and hpZ's secondary-shard group.
//
// The engine holds a table of them (ZeroEngine's groups) and each unit names its entry
// (ParamSpec::group): [0] the dense data-parallel group that ParallelLayout builds and, with
// expert parallelism, [1] the experts' (ParallelLayout::engine_groups()). Non-owning: the groups
// outlive whoever holds the table.
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
  // Expert parallelism: the ranks holding the group's other units (the other experts of each
  // layer: the expert-parallel group). The group's squared gradient norm is summed over the
  // shard group, then over these. Null (or a group of one): the shard group holds them all.
  ProcessGroup* norm_peers = nullptr;
  // What each reduced gradient slice is multiplied by after its average over the shard group
  // (and replicas): 1 / ep for expert units, whose gradients already sum the rows of the ep
  // group's ranks (models/moe/expert_dispatch.h, docs/multi-node.md). 1: left alone.
  float gradient_scale = 1.0f;
};

}  // namespace zrt
