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
  const DType cdt = options_.compute_dtype;
  allocate_gathered(u);
  // With optimizer offload the updated slice comes on the copy stream (a unit the device steps
  // is ordered by allocate_gathered's wait on the compute stream).
  if (state_on_host(u)) comm_.wait(offload_->params_ready(u));
  ProcessGroup& group = shard_group_of(u);
  DevicePtr<std::byte> mine =
      s.gathered.device<std::byte>() + bytes_of(slice_rank(u) * unit.shard, cdt);
  if (void* host_params = offload_ ? offload_->host_params(u) : nullptr) {
    // Parameter offload: the slice comes up from host memory into its place in the gathered
    // buffer just before the (in-place) gather, once the CPU optimizer has written it.
    offload_->wait_for_update(u, comm_);
    {
      TraceSpan span(trace_, comm_, TraceTrack::kComm, "h2d", "unit", u);
      device_.copy_to_device(mine, host_params, static_cast<std::size_t>(bytes_of(unit.shard, cdt)),
                             comm_);
    }
    TraceSpan span(trace_, comm_, TraceTrack::kComm, "all_gather", "unit", u);
    group.all_gather(mine, s.gathered.device<std::byte>(), unit.shard, cdt);
  } else if (options_.quantized_weights) {
    // qwZ: int8 codes and block scales on the wire; every rank (this one too) computes with
    // the same dequantized values.
    TraceSpan span(trace_, comm_, TraceTrack::kComm, "all_gather (int8)", "unit", u);
    group_of(u).quantized->all_gather(s.param_slice.device<std::byte>(),
                                      s.gathered.device<std::byte>(), unit.shard, cdt);
  } else {
    TraceSpan span(trace_, comm_, TraceTrack::kComm, "all_gather", "unit", u);
    group.all_gather(s.param_slice.device<std::byte>(), s.gathered.device<std::byte>(), unit.shard,
                     cdt);
  }
  s.gathered_ready->record(comm_);
}

void ZeroEngine::await_gather(int u) {
  compute_.wait(*units_[static_cast<std::size_t>(u)]->gathered_ready);
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
  TraceSpan span(trace_, comm_, TraceTrack::kComm, "all_gather (hpZ)", "unit", u);
  group_of(u).secondary->all_gather(s.secondary.device<std::byte>(), s.gathered.device<std::byte>(),
                                    schedule_.secondary_numel(u), options_.compute_dtype);
  span.end();
  s.gathered_ready->record(comm_);
}

void ZeroEngine::free_secondary(int u) {
  // The compute stream waited for the unit's last gather, the last read of the shard.
  units_[static_cast<std::size_t>(u)]->secondary.reset();
}

void ZeroEngine::publish_updated(int u, const Event* ready) {
  const Unit& unit = plan_.unit(u);
  const DType cdt = options_.compute_dtype;
  if (ready != nullptr) comm_.wait(*ready);
  DevicePtr<std::byte> full = full_params_of(u);
  TraceSpan span(trace_, comm_, TraceTrack::kComm, "all_gather", "unit", u);
  shard_group_of(u).all_gather(full + bytes_of(slice_rank(u) * unit.shard, cdt), full, unit.shard,
                               cdt);
  span.end();
  units_[static_cast<std::size_t>(u)]->gathered_ready->record(comm_);
}

}  // namespace zrt
