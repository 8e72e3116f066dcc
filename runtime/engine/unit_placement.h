// Where each unit's model state lives for a set of EngineOptions: the fp32 master weights, the
// optimizer's state, the compute-dtype parameter slice, the slice its gradient is accumulated
// in and the bucket its reduction reads. One pure function answers it for the engine (what it
// allocates on the device: unit_state.cc), the optimizer offload (what it keeps in host memory:
// offload/) and zrt-mem (what it counts where: tools/mem/), so the three cannot disagree.
//
// Today's decisions, all here: optimizer offload puts the master weights and the optimizer
// state of offload_optimizer.ratio's units in host memory (all of them at ratio 1; the last of
// the forward below it: UnitSchedule::offloaded_units); parameter offload (stage 3) puts the
// non-persistent units' parameter slices there and accumulates every gradient slice there; at
// one micro-batch per step an offloaded unit's reduced slice goes to host memory as it is
// (offload_takes_reduced_slices), so the device keeps no gradient slice for it. A frozen unit
// (Unit::frozen) holds no optimizer state and no gradient slice anywhere; its master weights
// stay where the offload puts them (they are what a checkpoint saves of it).
//
// Thread-safety: pure functions.
#pragma once

#include <vector>

#include "runtime/engine/engine_options.h"
#include "runtime/engine/partition.h"

namespace zrt {

enum class Residence {
  kDevice,
  kHost,  // pinned or pageable, as the offload block's pin_memory says
  kDisk,  // reserved for NVMe offload (not implemented: the config refuses it)
  kNone,  // not held at all: a frozen unit's optimizer state and gradient slice
};
const char* residence_name(Residence r);  // "device", "host", "disk", "none"

// Where one unit's buffers of this rank live.
struct UnitPlacement {
  Residence master = Residence::kDevice;           // the fp32 master slice
  Residence optimizer_state = Residence::kDevice;  // the optimizer's fp32 state tensors' slices
  // The compute-dtype parameters the rank owns: stage 3's slice of a non-persistent unit (stages
  // 0-2 and stage 3's persistent unit keep them in full parameters, on the device).
  Residence param_slice = Residence::kDevice;
  // Where the slice's final gradient is formed (accumulated over micro-batches in
  // grad_accum_dtype; stages 0-1: within the full gradients, on the device).
  Residence grad_slice = Residence::kDevice;
  // The per-micro-batch gradient bucket the reduction reads (stages 2-3).
  Residence reduction_bucket = Residence::kDevice;
  // The final reduced slice goes to host memory straight from the reduction's bucket, in the
  // compute dtype (offload_takes_reduced_slices, for a unit whose state is in host memory).
  bool reduced_slice_to_host = false;
  // Stage 3's gather of the unit would copy its slice unchanged: the unit is sliced over a
  // group of one rank (one GPU; an expert unit at full expert parallelism), its slice is on the
  // device and no qwZ rounds it. The model then reads the slice itself and no gathered buffer
  // is allocated (the engine's issue_gather; zrt-mem's schedule_peaks counts none for it).
  bool gathered_in_place = false;
  // Whether the unit's fp32 master weights are in the offload's host memory, where the CPU
  // optimizer steps it (a frozen unit's too, though nothing steps it).
  bool stepped_on_host() const { return master == Residence::kHost; }
  // A frozen unit: no optimizer state, no gradient slice, no reduction, no step.
  bool frozen() const { return optimizer_state == Residence::kNone; }
  bool operator==(const UnitPlacement& o) const {
    return master == o.master && optimizer_state == o.optimizer_state &&
           param_slice == o.param_slice && grad_slice == o.grad_slice &&
           reduction_bucket == o.reduction_bucket &&
           reduced_slice_to_host == o.reduced_slice_to_host &&
           gathered_in_place == o.gathered_in_place;
  }
};

// The rule for one unit: `state_offloaded` says whether the unit is one of optimizer offload's
// units (always false without offload_optimizer), `persistent` whether it is stage 3's
// persistent unit, `frozen` whether its parameters are frozen, `group_world` the ranks its
// group slices it over (0: not known, taken as several). zrt-mem's formula path, which has no
// units, asks it for either kind.
UnitPlacement placement_of(const EngineOptions& options, bool state_offloaded,
                           bool persistent = false, bool frozen = false, int group_world = 0);

// Every unit of `plan`, in unit order, with offload_optimizer.ratio's split and, from each
// unit's group size, gathered_in_place.
std::vector<UnitPlacement> unit_placements(const EngineOptions& options, const PartitionPlan& plan);

// Unit u's placement (unit_placements(options, plan)[u]).
UnitPlacement placement_of(const EngineOptions& options, const PartitionPlan& plan, int u);

// Whether a group sliced over `group_world` ranks has its (non-persistent) units read in place
// (UnitPlacement::gathered_in_place): stage 3, one rank, the slices on the device, no qwZ.
bool reads_slices_in_place(const EngineOptions& options, int group_world);

// The ranks a group's hpZ secondary shards are kept over (ScheduleOptions::hpz_group_sizes):
// `secondary_ranks` (its secondary group's size), or 0, none kept, where the group reads its
// slices in place: the unit is already whole on the rank, and a secondary copy of it would only
// cost memory and a copy (an expert unit at full expert parallelism under hpZ).
int hpz_secondary_ranks(const EngineOptions& options, int group_world, int secondary_ranks);

}  // namespace zrt
