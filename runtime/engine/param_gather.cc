// The engine's parameters on their way to the compute stream: stage 3 gathers each unit before
// its use and frees it after (issue_gather / await_gather / release_gather, in the order the
// schedule gives), with hpZ keeping a secondary shard after a unit's first gather and serving
// its later gathers from those (keep_secondary / issue_secondary_gather / free_secondary);
// stages 1-2 publish each unit's updated slice to every rank after a step.
// The collectives run on the comm stream; the compute stream meets them through each unit's
// gathered_ready event.
#include "runtime/common/error.h"
#include "runtime/engine/unit_state.h"
#include "runtime/trace/trace_span.h"

namespace zrt {

void ZeroEngine::allocate_gathered(int u) {
  units_[static_cast<std::size_t>(u)]->gathered = device_.allocate(
      bytes_of(plan_.unit(u).numel, options_.compute_dtype), MemCategory::kParams,
      fmt::format("unit {} gathered parameters", u), MemorySpace::kDevice, &compute_);
  // The gather follows the allocation and any update of the slice, both on the compute stream.
  compute_done_->record(compute_);
  comm_.wait(*compute_done_);
}

void ZeroEngine::issue_gather(int u) {
  UnitState& s = *units_[static_cast<std::size_t>(u)];
  const Unit& unit = plan_.unit(u);
  // At a group of one rank the slice is the unit (UnitPlacement::gathered_in_place): the model
  // reads it where it is, nothing is allocated or copied, and await_gather orders the compute
  // stream after an offloaded update's copy up. Nothing writes the slice while the model reads
  // it: an update follows the unit's gradient, which follows the unit's last use in the step,
  // and an offloaded update's copy up follows every read enqueued before the step (an eval
  // forward's; OptimizerOffload::update).
  if (placement(u).gathered_in_place) return;
  allocate_gathered(u);
  // A unit the CPU optimizer stepped comes up on the copy stream (a unit the device steps is
  // ordered by allocate_gathered's wait on the compute stream).
  if (s.params_ready != nullptr) comm_.wait(*s.params_ready);
  s.gather->gather({u, s.param_slice.device<std::byte>(), s.gathered.device<std::byte>(),
                    unit.shard, slice_rank(u)},
                   comm_, trace_);
  s.gathered_ready->record(comm_);
}

void ZeroEngine::await_gather(int u) {
  const UnitState& s = *units_[static_cast<std::size_t>(u)];
  if (placement(u).gathered_in_place) {
    // No gather on the comm stream to wait for (and none of its other work): the update only.
    if (s.params_ready != nullptr) compute_.wait(*s.params_ready);
    return;
  }
  compute_.wait(*s.gathered_ready);
}

void ZeroEngine::release_gather(int u) {
  // Ordered on the compute stream after the kernels that read it (and the compute stream
  // already waited for the gather that wrote it).
  units_[static_cast<std::size_t>(u)]->gathered.reset();
}

void ZeroEngine::keep_secondary(int u) {
  UnitState& s = *units_[static_cast<std::size_t>(u)];
  const DType cdt = options_.compute_dtype;
  const std::int64_t count = schedule_.secondary_numel(u);
  s.secondary = device_.allocate(bytes_of(count, cdt), MemCategory::kParams,
                                 fmt::format("unit {} hpZ secondary shard", u),
                                 MemorySpace::kDevice, &compute_);
  compute_done_->record(compute_);  // the allocation is ordered on the compute stream
  comm_.wait(*compute_done_);
  {
    // After the gather on the comm stream: this rank's piece of what every rank computes with
    // (with qwZ the dequantized values), so the backward's gather from the secondary shards
    // returns the forward's parameters bit for bit.
    TraceSpan span(trace_, comm_, TraceTrack::kComm, "keep secondary", "unit", u);
    device_.copy(s.secondary.device<std::byte>(),
                 at(s.gathered, group_of(u).secondary->rank() * count, cdt),
                 static_cast<std::size_t>(bytes_of(count, cdt)), comm_);
  }
  // The copy reads the gathered parameters: the compute stream, which frees them, waits for it.
  s.gathered_ready->record(comm_);
}

void ZeroEngine::issue_secondary_gather(int u) {
  UnitState& s = *units_[static_cast<std::size_t>(u)];
  allocate_gathered(u);
  s.secondary_gather->gather({u, s.secondary.device<std::byte>(), s.gathered.device<std::byte>(),
                              schedule_.secondary_numel(u), group_of(u).secondary->rank()},
                             comm_, trace_);
  s.gathered_ready->record(comm_);
}

void ZeroEngine::free_secondary(int u) {
  // The compute stream waited for the unit's last gather, the last read of the shard.
  units_[static_cast<std::size_t>(u)]->secondary.reset();
}

void ZeroEngine::publish_updated(int u, const Event* ready) {
  UnitState& s = *units_[static_cast<std::size_t>(u)];
  const Unit& unit = plan_.unit(u);
  if (ready != nullptr) comm_.wait(*ready);
  DevicePtr<std::byte> full = full_params_of(u);
  // In place, from the rank's piece of the full parameters.
  s.publish->gather({u, full + bytes_of(slice_rank(u) * unit.shard, options_.compute_dtype), full,
                     unit.shard, slice_rank(u)},
                    comm_, trace_);
  s.gathered_ready->record(comm_);
}

void ZeroEngine::publish_all_updated() {
  // In the next forward's order; the compute stream waits for each unit in acquire().
  for (int u : published_units_)
    publish_updated(u, units_[static_cast<std::size_t>(u)]->params_ready);
}

}  // namespace zrt
