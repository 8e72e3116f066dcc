// The optimizer's sides (step_strategy.h): the host decision's norm and the host's part of the
// update, with and without optimizer offload.
#include "runtime/engine/step_strategy.h"

#include "runtime/engine/engine_groups.h"
#include "runtime/engine/unit_state.h"
#include "runtime/trace/trace_span.h"

namespace zrt {

// The replicas hold equal gradient slices after the reduction, so each group's norm is summed
// over its shard group only; the groups' sums are then added in group order (one group: its
// sum, as it always was).
float ZeroEngine::DeviceStep::norm_squared() {
  e_.wait_for_comm();
  float norm_squared = 0.0f;
  Stream& reader = e_.enqueue_grad_norm_squared();
  e_.device_.copy_to_host(&norm_squared, e_.norm_.device<std::byte>(), sizeof(float), reader);
  reader.synchronize();
  if (&reader == &e_.comm_) e_.wait_for_comm();
  return norm_squared;
}

ZeroEngine::OffloadStep::OffloadStep(ZeroEngine& engine, OptimizerOffload& offload)
    : e_(engine), offload_(offload) {
  // A group whose units are sliced (stages 1-3, more than one rank) sums its ranks' squares.
  for (int world : engine_groups::group_worlds(e_.options_, e_.groups_)) {
    summed_over_ranks_.push_back(world > 1);
  }
}

// With offload the host summed its units' squares as their gradients landed; the slices may
// still be going down (the decision needs only the sums), so once the sum is known the streams
// that could write them again wait for their copies.
float ZeroEngine::OffloadStep::norm_squared() {
  e_.wait_for_comm();
  float norm_squared = 0.0f;
  for (std::size_t g = 0; g < e_.groups_.size(); ++g) {
    float group_norm = offload_.local_norm_squared(static_cast<int>(g));
    ProcessGroup* peers = e_.norm_peers_of(g);
    if (summed_over_ranks_[g] || peers != nullptr) {
      // Sum over the group's ranks (every rank takes the same decision).
      Stream& comm = e_.comm_;
      DrainOnUnwind drain(comm);  // the copies read and write group_norm on the stream
      const DevicePtr<std::byte> norm = e_.norm_.device<std::byte>();
      TraceSpan span(e_.trace_, comm, TraceTrack::kComm, "all_reduce grad norm");
      e_.device_.copy_to_device(norm, &group_norm, sizeof group_norm, comm);
      if (summed_over_ranks_[g]) {
        e_.groups_[g].shard->all_reduce(norm, norm, 1, DType::kFloat32, ReduceOp::kSum);
      }
      if (peers != nullptr) peers->all_reduce(norm, norm, 1, DType::kFloat32, ReduceOp::kSum);
      e_.device_.copy_to_host(&group_norm, norm, sizeof group_norm, comm);
      span.end();
      comm.synchronize();
    }
    norm_squared = g == 0 ? group_norm : norm_squared + group_norm;
  }
  e_.compute_.wait(offload_.gradients_read());
  e_.comm_.wait(offload_.gradients_read());
  return norm_squared;
}

void ZeroEngine::OffloadStep::update_on_host(std::int64_t step, double lr, double grad_scale) {
  // The host's writes must follow every read of the parameters enqueued before the step, on
  // either stream: an eval forward between the last backward and step() reads them on the
  // compute stream (and its gathers on comm), and nothing on the host waits for it. The compute
  // stream joins comm here; the offload orders its copies up and its writes of host parameter
  // slices after that point (OptimizerOffload::update). In a training step both streams are
  // past their last reads by now (the decision waited for the reductions), so this costs nothing.
  e_.compute_done_->record(e_.compute_);
  e_.comm_.wait(*e_.compute_done_);
  // The CPU steps the offloaded units in forward order; each goes up (the compute stream waits
  // for each unit in acquire(), not for all of them here).
  offload_.update(step, e_.steps_not_taken_, lr, grad_scale,
                  [this](int u) { return e_.owned_params_of(u); });
}

}  // namespace zrt
