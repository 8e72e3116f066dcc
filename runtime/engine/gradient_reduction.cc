// The engine's gradients: where the model writes them (stages 0-1, and stages 2-3 at a run of
// one rank whose slices are on the device (per_micro_batch_grads): the trained units' full
// gradients accumulated over the micro-batches; stages 2-3, and a frozen unit at any stage for a
// model that may write its gradients: a bucket per unit for one micro-batch's backward), their
// reduction across ranks (issue_reduce / await_reduce, as Megatron's start_grad_sync /
// finish_grad_sync), accumulation into the owned slice, and the step's global norm.
#include "runtime/common/error.h"
#include "runtime/engine/engine_kernels.h"
#include "runtime/engine/unit_state.h"
#include "runtime/trace/trace_span.h"

namespace zrt {

DType ZeroEngine::grad_dtype() const {
  return per_micro_batch_grads() ? options_.compute_dtype : options_.grad_accum_dtype;
}

DevicePtr<std::byte> ZeroEngine::grad(int index) {
  ZRT_CHECK(index >= 0 && index < static_cast<int>(params_.size()), "parameter index {}", index);
  const ParamPlacement& pl = plan_.placement(index);
  ZRT_CHECK(!plan_.unit(pl.unit).frozen || schedule_.options().frozen_buckets,
            "gradient of frozen parameter '{}' requested from a model that skips frozen "
            "parameters' gradients (Model::skips_frozen_gradients): it has no gradient buffer; "
            "take it through trained_grad(), which gives null for a frozen parameter",
            params_[static_cast<std::size_t>(index)].name);
  if (!per_micro_batch_grads() && !plan_.unit(pl.unit).frozen) {
    return full_grads_of(pl.unit) + bytes_of(pl.offset, options_.grad_accum_dtype);
  }
  const UnitState& s = *units_[static_cast<std::size_t>(pl.unit)];
  ZRT_CHECK(!s.grad_bucket.empty(),
            "gradient of '{}' requested outside the backward of a module "
            "using it",
            params_[static_cast<std::size_t>(index)].name);
  return at(s.grad_bucket, pl.offset, grad_dtype());
}

DevicePtr<std::byte> ZeroEngine::full_grads_of(int u) {
  const std::int64_t offset = full_grad_offset_[static_cast<std::size_t>(u)];
  ZRT_CHECK(offset >= 0, "unit {} is frozen: it has no full gradients", u);
  return at(full_grads_, offset, options_.grad_accum_dtype);
}

DevicePtr<std::byte> ZeroEngine::owned_grad_of(int u) {
  const Unit& unit = plan_.unit(u);
  if (per_micro_batch_grads())
    return units_[static_cast<std::size_t>(u)]->grad_slice.device<std::byte>();
  return full_grads_of(u) + bytes_of(slice_rank(u) * unit.shard, options_.grad_accum_dtype);
}

void ZeroEngine::open_grad_bucket(int u) {
  UnitState& s = *units_[static_cast<std::size_t>(u)];
  const Unit& unit = plan_.unit(u);
  // In the dtype the model writes gradients in: the compute dtype at stages 2-3; at stages 0-1
  // (a frozen unit's only) the accumulation dtype.
  s.grad_bucket =
      device_.allocate(bytes_of(unit.numel, grad_dtype()), MemCategory::kGrads,
                       fmt::format("unit {} gradient bucket", u), MemorySpace::kDevice, &compute_);
  device_.fill_zero(s.grad_bucket.device<std::byte>(),
                    static_cast<std::size_t>(s.grad_bucket.bytes()), compute_);
}

void ZeroEngine::free_grad_bucket(int u) {
  await_reduce(u);  // the reduction reads the bucket
  units_[static_cast<std::size_t>(u)]->grad_bucket.reset();
}

void ZeroEngine::await_reduce(int u) {
  if (plan_.unit(u).frozen) return;  // never reduced
  compute_.wait(*units_[static_cast<std::size_t>(u)]->reduced);
}

void ZeroEngine::issue_reduce(int u, bool final) {
  // A frozen unit's gradient, where the model may have written it (a norm's weight, an
  // embedding), is dropped unread: no collective, no sink, no norm, no step (Unit::frozen).
  if (plan_.unit(u).frozen) return;
  // The unit's gradients are complete once the compute stream gets here.
  compute_done_->record(compute_);
  comm_.wait(*compute_done_);
  if (per_micro_batch_grads()) {
    reduce_bucket(u, final);
  } else {
    reduce_full_gradients(u);
  }
  if (!options_.overlap_comm) wait_for_comm();
}

// Stages 2-3: one micro-batch's bucket, reduced into the rank's slice, which goes where the
// unit's sink says (the device's accumulation, or the offload's host memory).
void ZeroEngine::reduce_bucket(int u, bool final) {
  UnitState& s = *units_[static_cast<std::size_t>(u)];
  const Unit& unit = plan_.unit(u);
  const DType cdt = options_.compute_dtype;
  const DType wire = comm_dtype();
  TraceSpan span(trace_, comm_, TraceTrack::kComm, s.reduce->name(), "unit", u);
  const DevicePtr<std::byte> bucket = s.grad_bucket.device<std::byte>();
  DevicePtr<std::byte> source = bucket;
  if (wire != cdt) {
    if (scratch_reader_ != nullptr) {  // the previous slice in the scratch has gone down
      comm_.wait(*scratch_reader_);
      scratch_reader_ = nullptr;
    }
    engine_kernels::convert(device_, comm_, source, cdt, comm_scratch_.device<std::byte>(), wire,
                            unit.numel);
    source = comm_scratch_.device<std::byte>();
  }
  const ReducedPart mine = s.reduce->reduce(source, unit.shard, slice_rank(u), wire);
  ReducedSlice reduced;
  reduced.unit = u;
  reduced.data = mine.data;
  reduced.type = wire;
  reduced.count = mine.count;
  reduced.final = final;
  reduced.from_bucket = source == bucket;
  reduced.grad_slice = s.grad_slice.device<std::byte>();
  reduced.accum_type = options_.grad_accum_dtype;
  reduced.reduced = s.reduced.get();
  reduced.span = &span;
  s.sink->take(reduced, comm_);
  // A slice the copy stream reads from the conversion scratch: the next conversion into the
  // scratch waits for it (`reduced`, recorded there).
  if (s.sink->reads_later() && !reduced.from_bucket) scratch_reader_ = s.reduced.get();
}

// Stages 0-1 (and 2-3 at a run of one rank, per_micro_batch_grads): the full gradients,
// accumulated over the micro-batches, are reduced once (not at all where the unit has a single
// rank and no replicas: make_no_reduction's collective).
void ZeroEngine::reduce_full_gradients(int u) {
  UnitState& s = *units_[static_cast<std::size_t>(u)];
  const Unit& unit = plan_.unit(u);
  const DType adt = options_.grad_accum_dtype;
  const DType wire = comm_dtype();
  const DevicePtr<std::byte> grads = full_grads_of(u);
  TraceSpan span(trace_, comm_, TraceTrack::kComm, s.reduce->name(), "unit", u);
  if (s.reduce->communicates()) {
    DevicePtr<std::byte> work = grads;
    DType type = adt;
    if (wire != adt) {
      engine_kernels::convert(device_, comm_, grads, adt, comm_scratch_.device<std::byte>(), wire,
                              unit.numel);
      work = comm_scratch_.device<std::byte>();
      type = wire;
    }
    const ReducedPart mine = s.reduce->reduce(work, unit.shard, slice_rank(u), type);
    if (work != grads) {
      engine_kernels::convert(device_, comm_, mine.data, wire, grads + bytes_of(mine.first, adt),
                              adt, mine.count);
    }
  }
  ReducedSlice reduced;
  reduced.unit = u;
  reduced.final = true;
  reduced.grad_slice = grads + bytes_of(slice_rank(u) * unit.shard, adt);
  reduced.accum_type = adt;
  reduced.count = unit.shard;
  reduced.span = &span;
  s.sink->take(reduced, comm_);
}

// Without offload (DeviceStep, and the decision on the device): the squares of the owned
// gradient slices, summed into each group's float of norm_ on the compute stream, over each shard
// group on the comm stream, then the groups' sums into norm_[0]. Returns the stream norm_[0] is
// ready on (the caller waits for it or records an event there); nothing is read on the host.
Stream& ZeroEngine::enqueue_grad_norm_squared() {
  TraceSpan norm_span(trace_, compute_, TraceTrack::kCompute, "grad norm");
  const DevicePtr<float> norms = norm_.device<float>();
  device_.fill_zero(norm_.device<std::byte>(), static_cast<std::size_t>(norm_.bytes()), compute_);
  for (std::size_t ui = 0; ui < units_.size(); ++ui) {
    const Unit& unit = plan_.unit(static_cast<int>(ui));
    if (unit.frozen) continue;  // no gradient
    engine_kernels::add_sum_squares(device_, compute_, owned_grad_of(static_cast<int>(ui)),
                                    options_.grad_accum_dtype, unit.shard, norms + unit.group);
  }
  // The groups' sums into norm_[0], in group order, on `stream`.
  const auto add_groups = [&](Stream& stream) {
    for (std::size_t g = 1; g < groups_.size(); ++g) {
      engine_kernels::accumulate(device_, stream,
                                 (norms + static_cast<std::int64_t>(g)).as<const std::byte>(),
                                 DType::kFloat32, norms.as<std::byte>(), DType::kFloat32, 1);
    }
  };
  norm_span.end();
  if (!sliced() && !has_norm_peers()) {
    add_groups(compute_);
    return compute_;
  }
  compute_done_->record(compute_);
  comm_.wait(*compute_done_);
  TraceSpan span(trace_, comm_, TraceTrack::kComm, "all_reduce grad norm");
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const DevicePtr<std::byte> norm = (norms + static_cast<std::int64_t>(g)).as<std::byte>();
    if (options_.stage > 0 && groups_[g].shard->size() > 1) {
      groups_[g].shard->all_reduce(norm, norm, 1, DType::kFloat32, ReduceOp::kSum);
    }
    if (ProcessGroup* peers = norm_peers_of(g)) {
      peers->all_reduce(norm, norm, 1, DType::kFloat32, ReduceOp::kSum);
    }
  }
  add_groups(comm_);
  return comm_;
}

void ZeroEngine::zero_grads() {
  // Gradients start from zero for the next accumulation cycle.
  if (per_micro_batch_grads()) {
    for (auto& s : units_) {
      // Parameter offload: the offload's host gradient.
      if (s->grad_slice.empty()) continue;
      device_.fill_zero(s->grad_slice.device<std::byte>(),
                        static_cast<std::size_t>(s->grad_slice.bytes()), compute_);
    }
  } else {
    device_.fill_zero(full_grads_.device<std::byte>(),
                      static_cast<std::size_t>(full_grads_.bytes()), compute_);
  }
}

}  // namespace zrt
