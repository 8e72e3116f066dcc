// Optimizer (and parameter) offload: the fp32 state lives in host memory and the CPU steps it,
// overlapped with the copies that bring gradients down and parameters up.
//
// The pipeline of one step (DESIGN.md; clipping and the overflow check need every gradient
// first):
//   backward:  each unit's final gradient slice goes device->host on the copy stream as soon
//              as its reduction is done, while the backward of earlier units still runs;
//   decision:  the copy stream takes each unit's sum of squares as its gradient arrives; the
//              host waits for the last one and adds them in unit order (the device path's
//              order, so the clipping decision is the same bit for bit);
//   update:    the CPU-optimizer thread steps the units in the order the next forward needs
//              them, writing compute-dtype parameters into a ring of staging buffers; the copy
//              stream carries unit u up while the CPU steps unit u+1; stages 1-2 all-gather each
//              unit as it arrives. The next forward waits only for its own units (acquire()
//              waits for each unit's gather, stage 3's gathers for each unit's copy), so it runs
//              on the units already updated while the CPU steps the rest. With parameter
//              offload the CPU writes the host parameter slices directly and the gather copies
//              them up.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include <spdlog/spdlog.h>

#include "runtime/common/error.h"
#include "runtime/engine/engine_kernels.h"
#include "runtime/engine/unit_state.h"
#include "runtime/engine/zero_engine.h"
#include "runtime/trace/trace_span.h"

namespace zrt {

void ZeroEngine::setup_offload() {
  copy_ = device_.create_stream("copy");
  // A host thread, whatever the device: the CPU optimizer is host work on host memory.
  cpu_optimizer_ = std::make_unique<CpuStream>("cpu-optimizer", 0, 0);
  host_optimizer_ = optimizer_.make_host_optimizer();
  const DType cdt = options_.compute_dtype;
  std::int64_t max_shard = 0;
  for (const Unit& unit : plan_.units()) max_shard = std::max(max_shard, unit.shard);
  const MemorySpace host = host_space(options_.offload_optimizer);
  for (int i = 0; i < options_.offload_staging_buffers; ++i) {
    staging_.push_back(device_.allocate(bytes_of(max_shard, cdt), MemCategory::kWorkspace,
                                        fmt::format("offload staging buffer {}", i), host));
  }
  if (offload_param()) {
    host_reduced_ = device_.allocate(bytes_of(max_shard, DType::kFloat32), MemCategory::kWorkspace,
                                     "offloaded gradient transfer", host);
  }
  // The next forward needs units in the order of their first module.
  for (std::size_t u = 0; u < plan_.units().size(); ++u)
    forward_order_.push_back(static_cast<int>(u));
  std::stable_sort(forward_order_.begin(), forward_order_.end(), [&](int a, int b) {
    return plan_.unit(a).modules.front() < plan_.unit(b).modules.front();
  });
}

void ZeroEngine::offload_gradient(int u, DevicePtr<std::byte> reduced, DType type, bool final) {
  UnitState& s = *units_[static_cast<std::size_t>(u)];
  const Unit& unit = plan_.unit(u);
  const DType adt = options_.grad_accum_dtype;
  s.comm_point->record(comm_);
  copy_->wait(*s.comm_point);
  // host_grad is the previous step's input to the CPU optimizer until it is done with it.
  std::shared_future<void> consumed = s.cpu_done;
  copy_->host_callback([consumed] {
    if (consumed.valid()) consumed.get();
  });
  TraceSpan span(trace_, *copy_, TraceTrack::kCopy, "d2h", "unit", u);
  if (offload_param()) {
    // Every micro-batch: bring the reduced slice down and accumulate it on the host.
    void* staging = host_reduced_.host<void>();
    void* accum = s.host_grad.host<void>();
    const std::int64_t n = unit.shard;
    device_.copy_to_host(staging, reduced, static_cast<std::size_t>(bytes_of(n, type)), *copy_);
    s.reduced->record(*copy_);  // the bucket may go once it has been read
    copy_->host_callback([staging, type, accum, adt, n] {
      engine_kernels::cpu::accumulate(staging, type, accum, adt, n);
    });
  } else {
    ZRT_CHECK(type == adt, "offloaded gradient of unit {} in {} but grad_accum_dtype is {}", u,
              dtype_name(type), dtype_name(adt));
    device_.copy_to_host(s.host_grad.host<void>(), reduced,
                         static_cast<std::size_t>(bytes_of(unit.shard, adt)), *copy_);
  }
  span.end();
  if (final) {
    // The unit's share of the gradient norm, taken here while the backward of earlier units
    // still runs rather than by the host after the whole backward.
    TraceSpan norm_span(trace_, *copy_, TraceTrack::kCopy, "grad norm", "unit", u);
    const void* grad = s.host_grad.host<void>();
    double* out = &s.host_grad_sum_squares;
    const std::int64_t n = unit.shard;
    copy_->host_callback(
        [grad, adt, n, out] { *out = engine_kernels::cpu::sum_squares(grad, adt, n); });
    norm_span.end();
    s.d2h_done->record(*copy_);
  }
}

double ZeroEngine::offloaded_norm_squared() {
  // Unit by unit in fp64, added in fp32 in unit order: exactly what the device path computes, so
  // offload does not change the clipping decision by a single bit.
  float local = 0.0f;
  for (std::size_t u = 0; u < units_.size(); ++u) {
    UnitState& s = *units_[u];
    s.d2h_done->synchronize();  // the copy stream took the unit's sum of squares before it
    local += static_cast<float>(s.host_grad_sum_squares);
  }
  if (partition_world() == 1) return local;
  // Sum over ranks through the group (every rank takes the same decision).
  float value = local;
  TraceSpan span(trace_, comm_, TraceTrack::kComm, "all_reduce grad norm");
  device_.copy_to_device(norm_.device<std::byte>(), &value, sizeof value, comm_);
  group_.all_reduce(norm_.device<std::byte>(), norm_.device<std::byte>(), 1, DType::kFloat32,
                    ReduceOp::kSum);
  device_.copy_to_host(&value, norm_.device<std::byte>(), sizeof value, comm_);
  span.end();
  comm_.synchronize();
  return value;
}

ZeroEngine::OffloadStatus ZeroEngine::offload_status(int unit) const {
  ZRT_CHECK(offload_optimizer(), "offload_status() without optimizer offload");
  const UnitState& s = *units_[static_cast<std::size_t>(unit)];
  OffloadStatus status;
  status.cpu_updated = s.cpu_done.valid() &&
                       s.cpu_done.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  status.on_device = status.cpu_updated && (!s.host_params.empty() || s.params_ready->query());
  return status;
}

void ZeroEngine::zero_offloaded_grads() {
  for (auto& s : units_) {
    std::memset(s->host_grad.host<std::byte>(), 0, static_cast<std::size_t>(s->host_grad.bytes()));
  }
}

void ZeroEngine::update_offloaded(double lr, double factor) {
  ++optimizer_steps_;
  const std::int64_t step = optimizer_steps_;
  const DType cdt = options_.compute_dtype;
  const DType adt = options_.grad_accum_dtype;
  const int ring = static_cast<int>(staging_.size());
  int previous_staged[64];  // units that used each staging slot last (ring <= 64)
  ZRT_CHECK(ring <= 64, "offload_staging_buffers {} is above 64", ring);
  std::fill(previous_staged, previous_staged + ring, -1);
  int slot_cursor = 0;
  for (int u : forward_order_) {
    UnitState& s = *units_[static_cast<std::size_t>(u)];
    const Unit& unit = plan_.unit(u);
    auto done = std::make_shared<std::promise<void>>();
    s.cpu_done = done->get_future().share();
    // Where the CPU writes the updated compute-dtype slice.
    const bool direct = !s.host_params.empty();
    int slot = -1;
    int wait_for = -1;
    void* out = nullptr;
    if (direct) {
      out = s.host_params.host<void>();
    } else {
      slot = slot_cursor++ % ring;
      wait_for = previous_staged[slot];
      previous_staged[slot] = u;
      out = staging_[static_cast<std::size_t>(slot)].host<void>();
      // The copy stream carries it up once the CPU is done.
      DevicePtr<std::byte> destination =
          sharded_params() && !unit.persistent
              ? s.param_slice.device<std::byte>()
              : full_params_of(u) + bytes_of(rank_ * unit.shard, cdt);
      std::shared_future<void> ready = s.cpu_done;
      copy_->host_callback([ready] { ready.get(); });
      TraceSpan span(trace_, *copy_, TraceTrack::kCopy, "h2d", "unit", u);
      device_.copy_to_device(destination, out, static_cast<std::size_t>(bytes_of(unit.shard, cdt)),
                             *copy_);
      span.end();
      s.params_ready->record(*copy_);
    }
    std::vector<OptimizerSlice> slices;
    for (int p : unit.params) {
      const auto range = plan_.owned_range(p, rank_);
      if (range.count == 0) continue;
      OptimizerSlice slice;
      slice.param = s.master.host<float>() + range.slice_offset;
      for (std::size_t k = 0; k < s.state.size(); ++k) {
        slice.state[k] = s.state[k].host<float>() + range.slice_offset;
      }
      slice.grad = s.host_grad.host<std::byte>() + bytes_of(range.slice_offset, adt);
      slice.grad_dtype = adt;
      slice.param_out = static_cast<std::byte*>(out) + bytes_of(range.slice_offset, cdt);
      slice.out_dtype = cdt;
      slice.numel = range.count;
      slice.weight_decay = !params_[static_cast<std::size_t>(p)].no_weight_decay;
      slices.push_back(slice);
    }
    // Staging slots are reused: the slot's previous unit must have reached the device.
    Event* slot_free =
        wait_for >= 0 ? units_[static_cast<std::size_t>(wait_for)]->params_ready.get() : nullptr;
    // With parameter offload host_grad accumulates micro-batches and must start from zero;
    // otherwise the next step's copy overwrites it whole.
    void* grad = offload_param() ? s.host_grad.host<void>() : nullptr;
    const std::size_t grad_bytes = static_cast<std::size_t>(s.host_grad.bytes());
    const HostOptimizer* optimizer = host_optimizer_.get();
    const std::string span_name = optimizer_trace_name() + " unit " + std::to_string(u);
    TraceRecorder* trace = trace_;  // the CPU-optimizer thread records its own events
    cpu_optimizer_->enqueue([=, slices = std::move(slices)] {
      try {
        if (slot_free != nullptr) slot_free->synchronize();
        const double start_us = trace != nullptr ? trace->now_us() : 0.0;
        optimizer->step(slices, step, lr, factor);
        if (grad != nullptr) std::memset(grad, 0, grad_bytes);  // consumed: restart from zero
        if (trace != nullptr) {
          trace->add(TraceTrack::kCpuOptimizer, span_name, start_us, trace->now_us() - start_us);
        }
        done->set_value();
      } catch (...) {
        done->set_exception(std::current_exception());
        throw;
      }
    });
  }
  // Stages 1-2 (and stage 3's persistent unit): all-gather each unit once it is up. The compute
  // stream waits for each unit's gather in acquire(), not for all of them here, so the next
  // forward runs on the units already updated while the CPU steps the rest.
  for (int u : forward_order_) {
    const Unit& unit = plan_.unit(u);
    if (sharded_params() && !unit.persistent) continue;
    UnitState& s = *units_[static_cast<std::size_t>(u)];
    comm_.wait(*s.params_ready);
    DevicePtr<std::byte> full = full_params_of(u);
    TraceSpan span(trace_, comm_, TraceTrack::kComm, "all_gather", "unit", u);
    group_.all_gather(full + bytes_of(rank_ * unit.shard, cdt), full, unit.shard, cdt);
    span.end();
    s.gathered_ready->record(comm_);
  }
}

}  // namespace zrt
