// The engine's gradients: where the model writes them (stages 0-1: full gradients accumulated
// over the micro-batches; stages 2-3: a bucket per unit for one micro-batch's backward), their
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
  if (!per_micro_batch_grads()) {
    return at(full_grads_, plan_.unit(pl.unit).offset + pl.offset, options_.grad_accum_dtype);
  }
  const UnitState& s = *units_[static_cast<std::size_t>(pl.unit)];
  ZRT_CHECK(!s.grad_bucket.empty(),
            "gradient of '{}' requested outside the backward of a module "
            "using it",
            params_[static_cast<std::size_t>(index)].name);
  return at(s.grad_bucket, pl.offset, options_.compute_dtype);
}

DevicePtr<std::byte> ZeroEngine::owned_grad_of(int u) {
  const Unit& unit = plan_.unit(u);
  if (per_micro_batch_grads())
    return units_[static_cast<std::size_t>(u)]->grad_slice.device<std::byte>();
  return at(full_grads_, unit.offset + slice_rank(u) * unit.shard, options_.grad_accum_dtype);
}

void ZeroEngine::open_grad_bucket(int u) {
  UnitState& s = *units_[static_cast<std::size_t>(u)];
  const Unit& unit = plan_.unit(u);
  s.grad_bucket =
      device_.allocate(bytes_of(unit.numel, options_.compute_dtype), MemCategory::kGrads,
                       fmt::format("unit {} gradient bucket", u), MemorySpace::kDevice, &compute_);
  device_.fill_zero(s.grad_bucket.device<std::byte>(),
                    static_cast<std::size_t>(s.grad_bucket.bytes()), compute_);
}

void ZeroEngine::free_grad_bucket(int u) {
  await_reduce(u);  // the reduction reads the bucket
  units_[static_cast<std::size_t>(u)]->grad_bucket.reset();
}

void ZeroEngine::await_reduce(int u) {
  compute_.wait(*units_[static_cast<std::size_t>(u)]->reduced);
}

void ZeroEngine::issue_reduce(int u, bool final) {
  UnitState& s = *units_[static_cast<std::size_t>(u)];
  const Unit& unit = plan_.unit(u);
  const DType cdt = options_.compute_dtype;
  const DType adt = options_.grad_accum_dtype;
  const DType wire = comm_dtype();
  ProcessGroup& group = shard_group_of(u);
  const int rank = slice_rank(u);
  // The unit's gradients are complete once the compute stream gets here.
  compute_done_->record(compute_);
  comm_.wait(*compute_done_);
  TraceSpan span(trace_, comm_, TraceTrack::kComm,
                 options_.stage == 0 ? "all_reduce" : "reduce_scatter", "unit", u);
  if (per_micro_batch_grads()) {
    DevicePtr<std::byte> source = s.grad_bucket.device<std::byte>();
    if (wire != cdt) {
      if (scratch_reader_ != nullptr) {  // the previous slice in the scratch has gone down
        comm_.wait(*scratch_reader_);
        scratch_reader_ = nullptr;
      }
      engine_kernels::convert(device_, comm_, source, cdt, comm_scratch_.device<std::byte>(), wire,
                              unit.numel);
      source = comm_scratch_.device<std::byte>();
    }
    DevicePtr<std::byte> mine = source + bytes_of(rank * unit.shard, wire);
    if (options_.quantized_gradients) {
      // qgZ: quantized, summed in fp32 inside the node, then between nodes; into a slice of
      // its own (its input is the whole bucket).
      mine = quantized_out_.device<std::byte>();
      group_of(u).quantized->reduce_scatter(source, mine, unit.shard, wire, ReduceOp::kAvg);
    } else {
      group.reduce_scatter(source, mine, unit.shard, wire, ReduceOp::kAvg);
    }
    average_over_replicas(u, mine, unit.shard, wire);
    if (offload_param()) {
      // The reduced slice accumulates in host memory. It goes down from where the reduction
      // left it, in the communication dtype (an fp32 reduction keeps its precision): the bucket,
      // or the conversion scratch, which the next unit's conversion reuses only once the copy
      // stream has read it (`reduced`, recorded there).
      span.end();
      offload_->gradient_reduced(u, mine, wire, final, s.reduced.get());
      if (source != s.grad_bucket.device<std::byte>()) scratch_reader_ = s.reduced.get();
    } else if (s.grad_slice.empty()) {
      // One micro-batch per step, an offloaded unit (offload_takes_reduced_slices): the reduced
      // slice in the bucket is the final gradient and goes down from there; the bucket is
      // freed once the copy has read it (`reduced` is recorded on the copy stream then).
      ZRT_CHECK(offload_ && final && source == s.grad_bucket.device<std::byte>() && wire == cdt,
                "unit {} has no device gradient slice but its reduced slice is not the final "
                "one in the bucket",
                u);
      span.end();
      offload_->gradient_reduced(u, mine, wire, true, s.reduced.get());
    } else {
      engine_kernels::accumulate(device_, comm_, mine, wire, s.grad_slice.device<std::byte>(), adt,
                                 unit.shard);
      span.end();
      s.reduced->record(comm_);
      if (offload_ && final) {
        offload_->gradient_reduced(u, s.grad_slice.device<std::byte>(), adt, true, nullptr);
      }
    }
  } else if (group.size() > 1 || replicas_of(u) != nullptr) {
    // Stages 0-1: the full gradients, accumulated over the micro-batches, are reduced once.
    DevicePtr<std::byte> grads = at(full_grads_, unit.offset, adt);
    DevicePtr<std::byte> work = grads;
    DType type = adt;
    if (wire != adt) {
      engine_kernels::convert(device_, comm_, grads, adt, comm_scratch_.device<std::byte>(), wire,
                              unit.numel);
      work = comm_scratch_.device<std::byte>();
      type = wire;
    }
    // Stage 0 keeps the whole unit everywhere; stage 1 keeps the rank's slice.
    const std::int64_t first = options_.stage == 0 ? 0 : rank * unit.shard;
    const std::int64_t count = options_.stage == 0 ? unit.numel : unit.shard;
    if (options_.stage == 0) {
      group.all_reduce(work, work, unit.numel, type, ReduceOp::kAvg);
    } else {
      group.reduce_scatter(work, work + bytes_of(first, type), unit.shard, type, ReduceOp::kAvg);
      average_over_replicas(u, work + bytes_of(first, type), unit.shard, type);
    }
    if (work != grads) {
      engine_kernels::convert(device_, comm_, work + bytes_of(first, wire), wire,
                              grads + bytes_of(first, adt), adt, count);
    }
  }
  span.end();
  if (!per_micro_batch_grads() && offload_) {
    offload_->gradient_reduced(u, at(full_grads_, unit.offset + rank * unit.shard, adt), adt, true,
                               nullptr);
  }
  if (!options_.overlap_comm) wait_for_comm();
}

void ZeroEngine::average_over_replicas(int u, DevicePtr<std::byte> slice, std::int64_t count,
                                       DType type) {
  // Hierarchical sharding: the shard group's average, averaged again over the replicas of the
  // slice (the same stream: in order after the reduce-scatter).
  if (ProcessGroup* replicas = replicas_of(u)) {
    replicas->all_reduce(slice, slice, count, type, ReduceOp::kAvg);
  }
}

// The replicas hold equal gradient slices after the reduction, so each group's norm is summed
// over its shard group only; the groups' sums are then added in group order (one group: its
// sum, as it always was).
float ZeroEngine::global_grad_norm_squared() {
  wait_for_comm();
  float norm_squared = 0.0f;
  if (!offload_) {
    Stream& reader = enqueue_grad_norm_squared();
    device_.copy_to_host(&norm_squared, norm_.device<std::byte>(), sizeof(float), reader);
    reader.synchronize();
    if (&reader == &comm_) wait_for_comm();
    return norm_squared;
  }
  // With offload the host summed its units' squares as their gradients landed; the slices may
  // still be going down (the decision needs only the sums), so once the sum is known the streams
  // that could write them again wait for their copies.
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    float group_norm = offload_->local_norm_squared(static_cast<int>(g));
    if (options_.stage >= 1 && groups_[g].shard->size() > 1) {
      // Sum over the group's ranks (every rank takes the same decision).
      TraceSpan span(trace_, comm_, TraceTrack::kComm, "all_reduce grad norm");
      device_.copy_to_device(norm_.device<std::byte>(), &group_norm, sizeof group_norm, comm_);
      groups_[g].shard->all_reduce(norm_.device<std::byte>(), norm_.device<std::byte>(), 1,
                                   DType::kFloat32, ReduceOp::kSum);
      device_.copy_to_host(&group_norm, norm_.device<std::byte>(), sizeof group_norm, comm_);
      span.end();
      comm_.synchronize();
    }
    norm_squared = g == 0 ? group_norm : norm_squared + group_norm;
  }
  compute_.wait(offload_->gradients_read());
  comm_.wait(offload_->gradients_read());
  return norm_squared;
}

// Without offload: the squares of the owned gradient slices, summed into each group's float of
// norm_ on the compute stream, over each shard group on the comm stream, then the groups' sums
// into norm_[0]. Returns the stream norm_[0] is ready on (the caller waits for it or records an
// event there); nothing is read on the host.
Stream& ZeroEngine::enqueue_grad_norm_squared() {
  TraceSpan norm_span(trace_, compute_, TraceTrack::kCompute, "grad norm");
  const DevicePtr<float> norms = norm_.device<float>();
  device_.fill_zero(norm_.device<std::byte>(), static_cast<std::size_t>(norm_.bytes()), compute_);
  for (std::size_t ui = 0; ui < units_.size(); ++ui) {
    const Unit& unit = plan_.unit(static_cast<int>(ui));
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
  if (!sliced()) {
    add_groups(compute_);
    return compute_;
  }
  compute_done_->record(compute_);
  comm_.wait(*compute_done_);
  TraceSpan span(trace_, comm_, TraceTrack::kComm, "all_reduce grad norm");
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    if (groups_[g].shard->size() <= 1) continue;
    const DevicePtr<std::byte> norm = (norms + static_cast<std::int64_t>(g)).as<std::byte>();
    groups_[g].shard->all_reduce(norm, norm, 1, DType::kFloat32, ReduceOp::kSum);
  }
  add_groups(comm_);
  return comm_;
}

void ZeroEngine::zero_grads() {
  // Gradients start from zero for the next accumulation cycle.
  if (per_micro_batch_grads()) {
    for (auto& s : units_) {
      if (s->grad_slice.empty()) continue;  // parameter offload: the offload's host gradient
      device_.fill_zero(s->grad_slice.device<std::byte>(),
                        static_cast<std::size_t>(s->grad_slice.bytes()), compute_);
    }
  } else {
    device_.fill_zero(full_grads_.device<std::byte>(),
                      static_cast<std::size_t>(full_grads_.bytes()), compute_);
  }
}

}  // namespace zrt
