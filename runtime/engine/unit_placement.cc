// Where a unit's state lives (unit_placement.h).
#include "runtime/engine/unit_placement.h"

#include "runtime/common/error.h"
#include "runtime/engine/unit_schedule.h"

namespace zrt {

const char* residence_name(Residence r) {
  switch (r) {
    case Residence::kDevice:
      return "device";
    case Residence::kHost:
      return "host";
    case Residence::kDisk:
      return "disk";
    case Residence::kNone:
      return "none";
  }
  return "?";
}

UnitPlacement placement_of(const EngineOptions& options, bool state_offloaded, bool persistent,
                           bool frozen, int group_world) {
  const bool on_host = options.offload_optimizer.enabled && state_offloaded;
  const bool params_offloaded = options.offload_param.enabled;
  UnitPlacement p;
  p.master = on_host ? Residence::kHost : Residence::kDevice;
  p.optimizer_state = p.master;
  if (options.stage == 3 && !persistent && params_offloaded) p.param_slice = Residence::kHost;
  // At one rank the slice is the whole unit: its all-gather is a copy of it (to the byte: the
  // shard is the unit's padded numel), which qwZ alone would change.
  p.gathered_in_place = !persistent && reads_slices_in_place(options, group_world);
  p.reduced_slice_to_host = on_host && offload_takes_reduced_slices(options);
  // Stages 2-3 reduce into slices; with parameter offload every slice accumulates in host
  // memory, and a slice that goes down as it is has no device copy.
  if (options.stage >= 2 && (params_offloaded || p.reduced_slice_to_host)) {
    p.grad_slice = Residence::kHost;
  }
  if (frozen) {
    // Nothing trains it: no state to step, no gradient to form (its bucket, where the model may
    // still write, is dropped unread).
    p.optimizer_state = Residence::kNone;
    p.grad_slice = Residence::kNone;
    p.reduced_slice_to_host = false;
  }
  return p;
}

std::vector<UnitPlacement> unit_placements(const EngineOptions& options,
                                           const PartitionPlan& plan) {
  std::vector<bool> offloaded(plan.units().size(), false);
  if (options.offload_optimizer.enabled) {
    offloaded = UnitSchedule::offloaded_units(plan, options.offload_optimizer.ratio);
  }
  std::vector<UnitPlacement> placements;
  placements.reserve(offloaded.size());
  for (std::size_t u = 0; u < offloaded.size(); ++u) {
    const Unit& unit = plan.unit(static_cast<int>(u));
    placements.push_back(placement_of(options, offloaded[u], unit.persistent, unit.frozen,
                                      plan.group_world(unit.group)));
  }
  return placements;
}

bool reads_slices_in_place(const EngineOptions& options, int group_world) {
  return options.stage == 3 && group_world == 1 && !options.offload_param.enabled &&
         !options.quantized_weights;
}

int hpz_secondary_ranks(const EngineOptions& options, int group_world, int secondary_ranks) {
  return reads_slices_in_place(options, group_world) ? 0 : secondary_ranks;
}

UnitPlacement placement_of(const EngineOptions& options, const PartitionPlan& plan, int u) {
  ZRT_CHECK(u >= 0 && u < static_cast<int>(plan.units().size()), "unit {} of {}", u,
            plan.units().size());
  return unit_placements(options, plan)[static_cast<std::size_t>(u)];
}

}  // namespace zrt
