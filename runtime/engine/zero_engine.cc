#include "runtime/engine/zero_engine.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>

#include <spdlog/spdlog.h>

#include "runtime/common/error.h"
#include "runtime/engine/engine_kernels.h"
#include "runtime/engine/unit_state.h"
#include "runtime/trace/trace_span.h"

namespace zrt {

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::kForward:
      return "forward";
    case Phase::kBackward:
      return "backward";
    case Phase::kRecompute:
      return "recompute";
    case Phase::kEval:
      return "eval";
  }
  return "?";
}

ZeroEngine::ZeroEngine(Device& device, Stream& compute, ProcessGroup& group,
                       std::vector<ParamSpec> params, int num_modules, const EngineOptions& options,
                       DeviceOptimizer& optimizer)
    : device_(device),
      compute_(compute),
      group_(group),
      comm_(group.stream()),
      params_(std::move(params)),
      num_modules_(num_modules),
      options_(options),
      optimizer_(optimizer),
      plan_(params_,
            PartitionOptions{options.stage, options.stage == 0 ? 1 : group.size(),
                             options.reduce_bucket_size,
                             options.stage == 3 ? options.stage3_param_persistence_threshold : 0,
                             options.alignment, num_modules}),
      scaler_(options.loss_scale),
      rank_(options.stage == 0 ? 0 : group.rank()) {
  ZRT_CHECK(options.gradient_accumulation_steps >= 1, "gradient_accumulation_steps must be >= 1");
  ZRT_CHECK(is_floating(options.compute_dtype) && is_floating(options.grad_accum_dtype) &&
                is_floating(comm_dtype()),
            "engine dtypes must be floating point");
  ZRT_CHECK(options.stage3_prefetch_bucket_size >= 0 && options.stage3_max_live_parameters >= 0,
            "stage 3 prefetch/live limits must be >= 0");
  ZRT_CHECK(!offload_optimizer() || options.stage >= 1,
            "offload_optimizer needs ZeRO stage 1, 2 or 3 (stage {} keeps full optimizer state "
            "on every rank)",
            options.stage);
  ZRT_CHECK(optimizer.spec().num_states() <= kMaxOptimizerStates,
            "optimizer {} keeps {} state tensors; slices carry at most {} (kMaxOptimizerStates)",
            optimizer.spec().family, optimizer.spec().num_states(), kMaxOptimizerStates);
  ZRT_CHECK(!offload_param() || options.stage == 3,
            "offload_param needs ZeRO stage 3 (stage {} keeps full parameters on the device)",
            options.stage);
  ZRT_CHECK(!offload_param() || offload_optimizer(),
            "offload_param without offload_optimizer is not supported: enable both");
  ZRT_CHECK(options.offload_staging_buffers >= 1, "offload_staging_buffers must be >= 1");
  comm_done_ = device_.create_event();
  compute_done_ = device_.create_event();
  allocate_state();
  if (offload_optimizer()) setup_offload();
  spdlog::debug("engine: stage {}, {}", options_.stage, plan_.describe());
}

ZeroEngine::~ZeroEngine() {
  try {
    wait_state_copy();  // the copy reads the state this destructor frees
    if (cpu_optimizer_) cpu_optimizer_->synchronize();
    if (copy_) copy_->synchronize();
    comm_.synchronize();
    compute_.synchronize();
  } catch (const std::exception& e) {
    spdlog::warn("engine shut down after a stream error: {}", e.what());
  }
}

void ZeroEngine::synchronize() {
  if (cpu_optimizer_) cpu_optimizer_->synchronize();
  if (copy_) copy_->synchronize();
  comm_.synchronize();
  compute_.synchronize();
}

int ZeroEngine::partition_world() const {
  return options_.stage == 0 ? 1 : group_.size();
}

DType ZeroEngine::comm_dtype() const {
  return options_.communication_dtype.value_or(options_.compute_dtype);
}

DType ZeroEngine::grad_dtype() const {
  return per_micro_batch_grads() ? options_.compute_dtype : options_.grad_accum_dtype;
}

void ZeroEngine::allocate_state() {
  const DType cdt = options_.compute_dtype;
  const DType adt = options_.grad_accum_dtype;
  std::int64_t max_unit = 0;
  for (std::size_t u = 0; u < plan_.units().size(); ++u) {
    const Unit& unit = plan_.unit(static_cast<int>(u));
    max_unit = std::max(max_unit, unit.numel);
    auto s = std::make_unique<UnitState>();
    const std::string name = fmt::format("unit {}", u);
    // With optimizer offload the fp32 state never touches the device.
    const MemorySpace state_space =
        offload_optimizer() ? host_space(options_.offload_optimizer) : MemorySpace::kDevice;
    s->master = device_.allocate(bytes_of(unit.shard, DType::kFloat32), MemCategory::kMaster,
                                 name + " fp32 master", state_space);
    for (const std::string& state : optimizer_.spec().state_names) {
      s->state.push_back(device_.allocate(bytes_of(unit.shard, DType::kFloat32),
                                          MemCategory::kOptimizer, name + " " + state,
                                          state_space));
    }
    const bool params_on_host = offload_param() && !unit.persistent;
    if (sharded_params()) {
      if (unit.persistent) {
        s->resident = device_.allocate(bytes_of(unit.numel, cdt), MemCategory::kParams,
                                       name + " persistent params");
      } else if (params_on_host) {
        s->host_params =
            device_.allocate(bytes_of(unit.shard, cdt), MemCategory::kParams,
                             name + " param slice (offloaded)", host_space(options_.offload_param));
      } else {
        s->param_slice = device_.allocate(bytes_of(unit.shard, cdt), MemCategory::kParams,
                                          name + " param slice");
      }
    }
    if (offload_optimizer()) {
      s->host_grad = device_.allocate(bytes_of(unit.shard, adt), MemCategory::kGrads,
                                      name + " grad slice (offloaded)",
                                      host_space(options_.offload_optimizer));
      std::memset(s->host_grad.host<std::byte>(), 0,
                  static_cast<std::size_t>(s->host_grad.bytes()));
      s->comm_point = device_.create_event();
      s->d2h_done = device_.create_event();
      s->params_ready = device_.create_event();
    }
    // With parameter offload the gradient accumulates in host memory (host_grad).
    if (per_micro_batch_grads() && !offload_param()) {
      s->grad_slice =
          device_.allocate(bytes_of(unit.shard, adt), MemCategory::kGrads, name + " grad slice");
    }
    s->gathered_ready = device_.create_event();
    s->reduced = device_.create_event();
    units_.push_back(std::move(s));
  }
  if (!sharded_params()) {
    full_params_ = device_.allocate(bytes_of(plan_.total_numel(), cdt), MemCategory::kParams,
                                    "full parameters");
  }
  if (!per_micro_batch_grads()) {
    full_grads_ =
        device_.allocate(bytes_of(plan_.total_numel(), adt), MemCategory::kGrads, "full gradients");
  }
  const DType reduced_type = per_micro_batch_grads() ? cdt : adt;
  if (comm_dtype() != reduced_type && group_.size() > 1) {
    comm_scratch_ = device_.allocate(bytes_of(max_unit, comm_dtype()), MemCategory::kComm,
                                     "gradient conversion for communication_data_type");
  }
  norm_ = device_.allocate(sizeof(float), MemCategory::kWorkspace, "gradient norm");
}

DevicePtr<std::byte> ZeroEngine::full_params_of(int u) {
  const Unit& unit = plan_.unit(u);
  if (sharded_params()) {
    ZRT_CHECK(unit.persistent, "unit {} has no resident full parameters at stage 3", u);
    return units_[static_cast<std::size_t>(u)]->resident.device<std::byte>();
  }
  return at(full_params_, unit.offset, options_.compute_dtype);
}

DevicePtr<std::byte> ZeroEngine::owned_grad_of(int u) {
  const Unit& unit = plan_.unit(u);
  if (per_micro_batch_grads())
    return units_[static_cast<std::size_t>(u)]->grad_slice.device<std::byte>();
  return at(full_grads_, unit.offset + rank_ * unit.shard, options_.grad_accum_dtype);
}

void ZeroEngine::wait_for_comm() {
  comm_done_->record(comm_);
  compute_.wait(*comm_done_);
}

// ---- initialisation --------------------------------------------------------------------------

void ZeroEngine::initialize(const Initializer& init) {
  std::vector<float> piece;
  assign_state([&](int u, const StateArrays& arrays) {
    // assign_state() hands zeroed arrays: the optimizer state starts at zero, and so does the
    // padding of the master weights.
    float* master = arrays[0];
    const Unit& unit = plan_.unit(u);
    for (int p : unit.params) {
      const auto range = plan_.owned_range(p, rank_);
      if (range.count == 0) continue;
      piece.assign(static_cast<std::size_t>(range.count), 0.0f);
      init(p, range.first, range.count, piece.data());
      std::copy(piece.begin(), piece.end(), master + range.slice_offset);
    }
  });
}

void ZeroEngine::load_state(const EngineCounters& counters, const StateFiller& fill) {
  ZRT_CHECK(micro_batch_ == 0, "load_state() after {} micro-batches: only at a step boundary",
            micro_batch_);
  assign_state(fill);
  optimizer_steps_ = counters.optimizer_steps;
  skipped_steps_ = counters.skipped_steps;
  scaler_.restore(counters.loss_scale);
}

EngineCounters ZeroEngine::counters() const {
  return EngineCounters{optimizer_steps_, skipped_steps_, scaler_.state()};
}

std::string ZeroEngine::optimizer_trace_name() const {
  std::string name = optimizer_.spec().family;
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name;
}

void ZeroEngine::check_state_arrays(const StateArrays& arrays, const char* call) const {
  const OptimizerSpec& spec = optimizer_.spec();
  ZRT_CHECK(static_cast<int>(arrays.size()) == state_array_count(),
            "{}: {} host arrays for {} state (master + {} state tensors expected)", call,
            arrays.size(), spec.family, spec.num_states());
}

const Buffer& ZeroEngine::state_buffer(const UnitState& s, std::size_t array) {
  return array == 0 ? s.master : s.state[array - 1];
}

void ZeroEngine::copy_state_out(int u, const StateArrays& out) {
  ZRT_CHECK(micro_batch_ == 0, "copy_state_out() after {} micro-batches: only at a step boundary",
            micro_batch_);
  check_state_arrays(out, "copy_state_out()");
  UnitState& s = *units_[static_cast<std::size_t>(u)];
  const std::size_t bytes = static_cast<std::size_t>(plan_.unit(u).shard) * 4;
  if (offload_optimizer()) {
    cpu_optimizer_->synchronize();  // the CPU optimizer may still be writing the state
    for (std::size_t a = 0; a < out.size(); ++a) {
      std::memcpy(out[a], state_buffer(s, a).host<float>(), bytes);
    }
    return;
  }
  for (std::size_t a = 0; a < out.size(); ++a) {
    device_.copy_to_host(out[a], state_buffer(s, a).device<std::byte>(), bytes, compute_);
  }
  compute_.synchronize();
}

void ZeroEngine::copy_state_out_async(const StateArrays& out, std::function<void()> before) {
  ZRT_CHECK(micro_batch_ == 0,
            "copy_state_out_async() after {} micro-batches: only at a step boundary", micro_batch_);
  check_state_arrays(out, "copy_state_out_async()");
  const std::size_t arrays = out.size();
  std::vector<std::int64_t> offsets;  // where each unit's slice starts in the host arrays
  std::int64_t at = 0;
  for (std::size_t u = 0; u < units_.size(); ++u) {
    offsets.push_back(at);
    at += plan_.unit(static_cast<int>(u)).shard;
  }
  if (offload_optimizer()) {
    // Host state, written only by the CPU optimizer's thread: the copy goes after its last
    // update in that thread's queue, and the next step's updates after the copy.
    if (!state_copied_) state_copied_ = std::make_unique<CpuEvent>();
    if (before) cpu_optimizer_->host_callback(std::move(before));
    std::vector<const float*> sources;
    std::vector<std::size_t> bytes;
    for (auto& s : units_) {
      for (std::size_t a = 0; a < arrays; ++a) sources.push_back(state_buffer(*s, a).host<float>());
    }
    for (std::size_t u = 0; u < units_.size(); ++u) {
      bytes.push_back(static_cast<std::size_t>(plan_.unit(static_cast<int>(u)).shard) * 4);
    }
    cpu_optimizer_->enqueue([=] {
      for (std::size_t u = 0; u < bytes.size(); ++u) {
        for (std::size_t a = 0; a < arrays; ++a) {
          std::memcpy(out[a] + offsets[u], sources[arrays * u + a], bytes[u]);
        }
      }
    });
    state_copied_->record(*cpu_optimizer_);
    return;
  }
  if (!state_copy_stream_) {
    state_copy_stream_ = device_.create_stream("state copy");
    state_copied_ = device_.create_event();
    state_updated_ = device_.create_event();
  }
  Stream& stream = *state_copy_stream_;
  state_updated_->record(compute_);  // the last update is enqueued on the compute stream
  stream.wait(*state_updated_);
  if (before) stream.host_callback(std::move(before));
  for (std::size_t u = 0; u < units_.size(); ++u) {
    const UnitState& s = *units_[u];
    const auto bytes = static_cast<std::size_t>(plan_.unit(static_cast<int>(u)).shard) * 4;
    const std::int64_t o = offsets[u];
    for (std::size_t a = 0; a < arrays; ++a) {
      device_.copy_to_host(out[a] + o, state_buffer(s, a).device<std::byte>(), bytes, stream);
    }
  }
  state_copied_->record(stream);
}

void ZeroEngine::wait_state_copy() {
  if (state_copied_) state_copied_->synchronize();
}

void ZeroEngine::order_update_after_state_copy() {
  if (!state_copied_) return;
  if (offload_optimizer()) {
    cpu_optimizer_->wait(*state_copied_);  // also implied by the queue's order; kept explicit
  } else {
    compute_.wait(*state_copied_);
  }
}

void ZeroEngine::assign_state(const StateFiller& fill) {
  const DType cdt = options_.compute_dtype;
  // Nothing may still read or write the state being replaced.
  wait_state_copy();
  if (cpu_optimizer_) cpu_optimizer_->synchronize();
  if (copy_) copy_->synchronize();
  compute_.synchronize();
  comm_.synchronize();
  // host_state[0]: the master weights; then one per optimizer state tensor.
  std::vector<std::vector<float>> host_state(static_cast<std::size_t>(state_array_count()));
  StateArrays arrays(host_state.size());
  for (std::size_t ui = 0; ui < units_.size(); ++ui) {
    const int u = static_cast<int>(ui);
    const Unit& unit = plan_.unit(u);
    UnitState& s = *units_[ui];
    for (std::size_t a = 0; a < host_state.size(); ++a) {
      host_state[a].assign(static_cast<std::size_t>(unit.shard), 0.0f);
      arrays[a] = host_state[a].data();
    }
    fill(u, arrays);
    const std::vector<float>& host = host_state[0];
    if (offload_optimizer()) {
      // Host state: written directly; the compute-dtype copy goes up through a host buffer.
      for (std::size_t a = 0; a < host_state.size(); ++a) {
        std::memcpy(state_buffer(s, a).host<float>(), host_state[a].data(), host.size() * 4);
      }
      if (!s.host_params.empty()) {
        engine_kernels::cpu::convert(host.data(), DType::kFloat32, s.host_params.host<void>(), cdt,
                                     unit.shard);
      } else {
        std::vector<std::byte> converted(static_cast<std::size_t>(bytes_of(unit.shard, cdt)));
        engine_kernels::cpu::convert(host.data(), DType::kFloat32, converted.data(), cdt,
                                     unit.shard);
        DevicePtr<std::byte> owned = sharded_params() && !unit.persistent
                                         ? s.param_slice.device<std::byte>()
                                         : full_params_of(u) + bytes_of(rank_ * unit.shard, cdt);
        device_.copy_to_device(owned, converted.data(), converted.size(), compute_);
        compute_.synchronize();  // `converted` goes out of scope
      }
    } else {
      for (std::size_t a = 0; a < host_state.size(); ++a) {
        device_.copy_to_device(state_buffer(s, a).device<std::byte>(), host_state[a].data(),
                               host.size() * 4, compute_);
      }
      compute_.synchronize();  // the host vectors are reused for the next unit
      // The compute-dtype copy of the owned slice.
      DevicePtr<std::byte> owned_params =
          sharded_params() && !unit.persistent
              ? s.param_slice.device<std::byte>()
              : full_params_of(u) + bytes_of(rank_ * unit.shard, cdt);
      engine_kernels::convert(device_, compute_, s.master.device<std::byte>(), DType::kFloat32,
                              owned_params, cdt, unit.shard);
    }
    if (!s.grad_slice.empty()) {
      device_.fill_zero(s.grad_slice.device<std::byte>(),
                        static_cast<std::size_t>(s.grad_slice.bytes()), compute_);
    }
  }
  if (!per_micro_batch_grads()) {
    device_.fill_zero(full_grads_.device<std::byte>(),
                      static_cast<std::size_t>(full_grads_.bytes()), compute_);
  }
  // Every rank holds its slice; stages 1-2 (and stage 3's persistent unit) need full copies.
  if (options_.stage >= 1) {
    compute_done_->record(compute_);
    comm_.wait(*compute_done_);
    for (std::size_t ui = 0; ui < units_.size(); ++ui) {
      const int u = static_cast<int>(ui);
      const Unit& unit = plan_.unit(u);
      if (sharded_params() && !unit.persistent) continue;
      DevicePtr<std::byte> full = full_params_of(u);
      group_.all_gather(full + bytes_of(rank_ * unit.shard, cdt), full, unit.shard, cdt);
    }
    wait_for_comm();
  }
  compute_.synchronize();
  comm_.synchronize();
}

// ---- ParamAccess -----------------------------------------------------------------------------

DevicePtr<std::byte> ZeroEngine::param(int index) {
  ZRT_CHECK(index >= 0 && index < static_cast<int>(params_.size()), "parameter index {}", index);
  const ParamPlacement& pl = plan_.placement(index);
  const Unit& unit = plan_.unit(pl.unit);
  const DType cdt = options_.compute_dtype;
  if (sharded_params() && !unit.persistent) {
    const UnitState& s = *units_[static_cast<std::size_t>(pl.unit)];
    ZRT_CHECK(s.gather_issued, "parameter '{}' used while no module using it is acquired",
              params_[static_cast<std::size_t>(index)].name);
    return at(s.gathered, pl.offset, cdt);
  }
  return full_params_of(pl.unit) + bytes_of(pl.offset, cdt);
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

void ZeroEngine::acquire(int module, Phase phase) {
  ZRT_CHECK(module >= 0 && module < num_modules_, "module {} outside 0..{}", module,
            num_modules_ - 1);
  ZRT_CHECK(phase != Phase::kBackward || micro_batch_ < options_.gradient_accumulation_steps,
            "backward of micro-batch {} but gradient_accumulation_steps is {}: call step() at the "
            "accumulation boundary",
            micro_batch_ + 1, options_.gradient_accumulation_steps);
  const auto& units = plan_.module_units(module);
  if (sharded_params()) {
    for (int u : units) {
      if (plan_.unit(u).persistent) continue;
      gather(u);
      compute_.wait(*units_[static_cast<std::size_t>(u)]->gathered_ready);
    }
    prefetch_after(module, phase);
  }
  if (offload_optimizer()) {
    // Full parameters (stages 1-2, stage 3's persistent unit) are all-gathered unit by unit
    // after an offloaded step (update_offloaded): wait for this module's units only, so the
    // next forward starts while the CPU optimizer still steps later units. An event never
    // recorded (before the first step) is no wait.
    for (int u : units) {
      if (sharded_params() && !plan_.unit(u).persistent) continue;
      compute_.wait(*units_[static_cast<std::size_t>(u)]->gathered_ready);
    }
  }
  if (phase == Phase::kBackward && per_micro_batch_grads()) {
    for (int u : units) open_grad_bucket(u);
  }
  // The model's kernels for this module, until release().
  if (trace_ != nullptr) {
    compute_.trace_begin(*trace_, TraceTrack::kCompute,
                         std::string(phase_name(phase)) + " module " + std::to_string(module));
  }
}

void ZeroEngine::release(int module, Phase phase) {
  ZRT_CHECK(module >= 0 && module < num_modules_, "module {} outside 0..{}", module,
            num_modules_ - 1);
  if (trace_ != nullptr) compute_.trace_end();
  const auto& units = plan_.module_units(module);
  const bool last_micro_batch = micro_batch_ == options_.gradient_accumulation_steps - 1;
  if (phase == Phase::kBackward) {
    for (int u : units) {
      if (plan_.unit(u).last_backward_module != module) continue;
      if (per_micro_batch_grads() || last_micro_batch) reduce_unit(u);
    }
  }
  if (sharded_params()) {
    // Keep what the very next module use needs (the last forward module is used again at once
    // by its backward; a recompute is followed by the same module's backward).
    int next = -1;
    if (phase == Phase::kForward) next = module + 1 < num_modules_ ? module + 1 : module;
    if (phase == Phase::kEval) next = module + 1 < num_modules_ ? module + 1 : -1;
    if (phase == Phase::kRecompute) next = module;
    if (phase == Phase::kBackward) next = module - 1;
    for (int u : units) {
      const Unit& unit = plan_.unit(u);
      if (unit.persistent) continue;
      const bool needed_next = next >= 0 && std::find(unit.modules.begin(), unit.modules.end(),
                                                      next) != unit.modules.end();
      if (!needed_next) release_gathered(u);
    }
  }
  if (phase == Phase::kBackward && module == 0) {
    ++micro_batch_;
    close_grad_buckets();  // every bucket of this micro-batch has been reduced
  }
}

// ---- stage 3 gathering -----------------------------------------------------------------------

void ZeroEngine::gather(int u) {
  UnitState& s = *units_[static_cast<std::size_t>(u)];
  if (s.gather_issued) return;
  const Unit& unit = plan_.unit(u);
  const DType cdt = options_.compute_dtype;
  s.gathered = device_.allocate(bytes_of(unit.numel, cdt), MemCategory::kParams,
                                fmt::format("unit {} gathered parameters", u), MemorySpace::kDevice,
                                &compute_);
  // The gather follows the allocation and any update of the slice, both on the compute stream
  // (or, with optimizer offload, the copy stream that brought the updated slice).
  compute_done_->record(compute_);
  comm_.wait(*compute_done_);
  if (offload_optimizer()) comm_.wait(*s.params_ready);
  if (!s.host_params.empty()) {
    // Parameter offload: the slice comes up from host memory into its place in the gathered
    // buffer just before the (in-place) gather, once the CPU optimizer has written it.
    DevicePtr<std::byte> mine = s.gathered.device<std::byte>() + bytes_of(rank_ * unit.shard, cdt);
    std::shared_future<void> updated = s.cpu_done;
    comm_.host_callback([updated] {
      if (updated.valid()) updated.get();
    });
    {
      TraceSpan span(trace_, comm_, TraceTrack::kComm, "h2d", "unit", u);
      device_.copy_to_device(mine, s.host_params.host<void>(),
                             static_cast<std::size_t>(bytes_of(unit.shard, cdt)), comm_);
    }
    TraceSpan span(trace_, comm_, TraceTrack::kComm, "all_gather", "unit", u);
    group_.all_gather(mine, s.gathered.device<std::byte>(), unit.shard, cdt);
  } else {
    TraceSpan span(trace_, comm_, TraceTrack::kComm, "all_gather", "unit", u);
    group_.all_gather(s.param_slice.device<std::byte>(), s.gathered.device<std::byte>(), unit.shard,
                      cdt);
  }
  s.gathered_ready->record(comm_);
  s.gather_issued = true;
  live_gathered_ += unit.numel;
}

void ZeroEngine::release_gathered(int u) {
  UnitState& s = *units_[static_cast<std::size_t>(u)];
  if (!s.gather_issued) return;
  // Ordered on the compute stream after the kernels that read it (and the compute stream
  // already waited for the gather that wrote it).
  s.gathered.reset();
  s.gather_issued = false;
  live_gathered_ -= plan_.unit(u).numel;
}

void ZeroEngine::prefetch_after(int module, Phase phase) {
  std::int64_t budget = options_.stage3_prefetch_bucket_size;
  // The module uses that follow this one in the static schedule.
  std::vector<int> next;
  if (phase == Phase::kForward || phase == Phase::kEval) {
    for (int m = module + 1; m < num_modules_; ++m) next.push_back(m);
    if (phase == Phase::kForward) {
      for (int m = num_modules_ - 1; m >= 0; --m) next.push_back(m);
    }
  } else {
    for (int m = module - 1; m >= 0; --m) next.push_back(m);
  }
  for (int m : next) {
    for (int u : plan_.module_units(m)) {
      const Unit& unit = plan_.unit(u);
      if (unit.persistent || units_[static_cast<std::size_t>(u)]->gather_issued) continue;
      if (unit.numel > budget) return;
      if (live_gathered_ + unit.numel > options_.stage3_max_live_parameters) return;
      gather(u);
      budget -= unit.numel;
    }
  }
}

// ---- gradients -------------------------------------------------------------------------------

void ZeroEngine::open_grad_bucket(int u) {
  UnitState& s = *units_[static_cast<std::size_t>(u)];
  if (!s.grad_bucket.empty()) return;
  const Unit& unit = plan_.unit(u);
  // Units whose modules are contiguous in backward order finish before the next one opens, so
  // their buffers rotate: at most two live, this one and the one being reduced. A shared or
  // persistent unit stays open until its last use (module 0's backward at the latest).
  const bool rotates = !unit.shared && !unit.persistent;
  if (rotates) {
    while (!rotating_buckets_.empty()) {
      UnitState& old = *units_[static_cast<std::size_t>(rotating_buckets_.front())];
      compute_.wait(*old.reduced);
      old.grad_bucket.reset();
      rotating_buckets_.pop_front();
    }
    rotating_buckets_.push_back(u);
  } else {
    pinned_buckets_.push_back(u);
  }
  s.grad_bucket =
      device_.allocate(bytes_of(unit.numel, options_.compute_dtype), MemCategory::kGrads,
                       fmt::format("unit {} gradient bucket", u), MemorySpace::kDevice, &compute_);
  device_.fill_zero(s.grad_bucket.device<std::byte>(),
                    static_cast<std::size_t>(s.grad_bucket.bytes()), compute_);
}

void ZeroEngine::close_grad_buckets() {
  for (auto* list : {&rotating_buckets_, &pinned_buckets_}) {
    for (int u : *list) {
      UnitState& s = *units_[static_cast<std::size_t>(u)];
      compute_.wait(*s.reduced);
      s.grad_bucket.reset();
    }
    list->clear();
  }
}

void ZeroEngine::reduce_unit(int u) {
  UnitState& s = *units_[static_cast<std::size_t>(u)];
  const Unit& unit = plan_.unit(u);
  const DType cdt = options_.compute_dtype;
  const DType adt = options_.grad_accum_dtype;
  const DType wire = comm_dtype();
  const bool last_micro_batch = micro_batch_ == options_.gradient_accumulation_steps - 1;
  // The unit's gradients are complete once the compute stream gets here.
  compute_done_->record(compute_);
  comm_.wait(*compute_done_);
  TraceSpan span(trace_, comm_, TraceTrack::kComm,
                 options_.stage == 0 ? "all_reduce" : "reduce_scatter", "unit", u);
  if (per_micro_batch_grads()) {
    DevicePtr<std::byte> source = s.grad_bucket.device<std::byte>();
    if (wire != cdt) {
      engine_kernels::convert(device_, comm_, source, cdt, comm_scratch_.device<std::byte>(), wire,
                              unit.numel);
      source = comm_scratch_.device<std::byte>();
    }
    DevicePtr<std::byte> mine = source + bytes_of(rank_ * unit.shard, wire);
    group_.reduce_scatter(source, mine, unit.shard, wire, ReduceOp::kAvg);
    if (offload_param()) {
      // The reduced slice accumulates in host memory. Copy it out of the bucket (not the shared
      // conversion scratch, which the next unit's reduction reuses).
      DevicePtr<std::byte> out = mine;
      DType out_type = wire;
      if (source != s.grad_bucket.device<std::byte>()) {
        out = s.grad_bucket.device<std::byte>() + bytes_of(rank_ * unit.shard, cdt);
        engine_kernels::convert(device_, comm_, mine, wire, out, cdt, unit.shard);
        out_type = cdt;
      }
      span.end();
      offload_gradient(u, out, out_type, last_micro_batch);
    } else {
      engine_kernels::accumulate(device_, comm_, mine, wire, s.grad_slice.device<std::byte>(), adt,
                                 unit.shard);
      span.end();
      s.reduced->record(comm_);
      if (offload_optimizer() && last_micro_batch) {
        offload_gradient(u, s.grad_slice.device<std::byte>(), adt, true);
      }
    }
  } else if (group_.size() > 1) {
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
    const std::int64_t first = options_.stage == 0 ? 0 : rank_ * unit.shard;
    const std::int64_t count = options_.stage == 0 ? unit.numel : unit.shard;
    if (options_.stage == 0) {
      group_.all_reduce(work, work, unit.numel, type, ReduceOp::kAvg);
    } else {
      group_.reduce_scatter(work, work + bytes_of(first, type), unit.shard, type, ReduceOp::kAvg);
    }
    if (work != grads) {
      engine_kernels::convert(device_, comm_, work + bytes_of(first, wire), wire,
                              grads + bytes_of(first, adt), adt, count);
    }
  }
  span.end();
  if (!per_micro_batch_grads() && offload_optimizer()) {
    offload_gradient(u, at(full_grads_, unit.offset + rank_ * unit.shard, adt), adt, true);
  }
  if (!options_.overlap_comm) wait_for_comm();
}

// ---- the step --------------------------------------------------------------------------------

StepResult ZeroEngine::step(double lr) {
  ZRT_CHECK(micro_batch_ == options_.gradient_accumulation_steps,
            "step() after {} micro-batches; gradient_accumulation_steps is {}", micro_batch_,
            options_.gradient_accumulation_steps);
  const int accumulation = options_.gradient_accumulation_steps;
  const double scale = options_.compute_dtype == DType::kFloat16 ? scaler_.scale() : 1.0;
  StepResult result;
  result.loss_scale = scale;

  // Global decision: the squared norm of the whole gradient, summed over ranks.
  wait_for_comm();
  float norm_squared = 0.0f;
  if (offload_optimizer()) {
    norm_squared = static_cast<float>(offloaded_norm_squared());
  } else {
    TraceSpan norm_span(trace_, compute_, TraceTrack::kCompute, "grad norm");
    device_.fill_zero(norm_.device<std::byte>(), sizeof(float), compute_);
    for (std::size_t ui = 0; ui < units_.size(); ++ui) {
      const Unit& unit = plan_.unit(static_cast<int>(ui));
      engine_kernels::add_sum_squares(device_, compute_, owned_grad_of(static_cast<int>(ui)),
                                      options_.grad_accum_dtype, unit.shard, norm_.device<float>());
    }
    norm_span.end();
    Stream* reader = &compute_;
    if (partition_world() > 1) {
      compute_done_->record(compute_);
      comm_.wait(*compute_done_);
      TraceSpan span(trace_, comm_, TraceTrack::kComm, "all_reduce grad norm");
      group_.all_reduce(norm_.device<std::byte>(), norm_.device<std::byte>(), 1, DType::kFloat32,
                        ReduceOp::kSum);
      reader = &comm_;
    }
    device_.copy_to_host(&norm_squared, norm_.device<std::byte>(), sizeof(float), *reader);
    reader->synchronize();
    if (reader == &comm_) wait_for_comm();
  }

  const double norm = std::sqrt(static_cast<double>(norm_squared)) / (accumulation * scale);
  result.grad_norm = norm;
  const bool finite = std::isfinite(norm_squared);
  if (finite) {
    order_update_after_state_copy();  // a checkpoint may still be copying the state out
    double factor = 1.0 / (accumulation * scale);
    if (options_.gradient_clipping > 0.0) {
      const double clip = options_.gradient_clipping / (norm + 1e-6);  // DeepSpeed's rule
      if (clip < 1.0) factor *= clip;
    }
    if (offload_optimizer()) {
      update_offloaded(lr, factor);
    } else {
      std::vector<OptimizerDeviceSlice> slices;
      for (std::size_t ui = 0; ui < units_.size(); ++ui) {
        const int u = static_cast<int>(ui);
        const Unit& unit = plan_.unit(u);
        UnitState& s = *units_[ui];
        DevicePtr<std::byte> out =
            sharded_params() && !unit.persistent
                ? s.param_slice.device<std::byte>()
                : full_params_of(u) + bytes_of(rank_ * unit.shard, options_.compute_dtype);
        for (int p : unit.params) {
          const auto range = plan_.owned_range(p, rank_);
          if (range.count == 0) continue;
          OptimizerDeviceSlice slice;
          slice.param = s.master.device<float>() + range.slice_offset;
          for (std::size_t k = 0; k < s.state.size(); ++k) {
            slice.state[k] = s.state[k].device<float>() + range.slice_offset;
          }
          slice.grad = owned_grad_of(u) + bytes_of(range.slice_offset, options_.grad_accum_dtype);
          slice.grad_dtype = options_.grad_accum_dtype;
          slice.param_out = out + bytes_of(range.slice_offset, options_.compute_dtype);
          slice.out_dtype = options_.compute_dtype;
          slice.numel = range.count;
          slice.weight_decay = !params_[static_cast<std::size_t>(p)].no_weight_decay;
          slices.push_back(slice);
        }
      }
      ++optimizer_steps_;
      {
        const std::string what = optimizer_trace_name() + " (all units)";
        TraceSpan span(trace_, compute_, TraceTrack::kCompute, what.c_str());
        optimizer_.step(slices, optimizer_steps_, lr, compute_, factor);
      }
      // Publish the updated parameters: stages 1-2 (and stage 3's persistent unit) gather them.
      if (options_.stage >= 1) {
        compute_done_->record(compute_);
        comm_.wait(*compute_done_);
        for (std::size_t ui = 0; ui < units_.size(); ++ui) {
          const int u = static_cast<int>(ui);
          const Unit& unit = plan_.unit(u);
          if (sharded_params() && !unit.persistent) continue;
          DevicePtr<std::byte> full = full_params_of(u);
          TraceSpan span(trace_, comm_, TraceTrack::kComm, "all_gather", "unit", u);
          group_.all_gather(full + bytes_of(rank_ * unit.shard, options_.compute_dtype), full,
                            unit.shard, options_.compute_dtype);
        }
        wait_for_comm();
      }
    }
  } else {
    result.skipped = true;
    if (offload_optimizer()) zero_offloaded_grads();
    ++skipped_steps_;
    spdlog::warn("step skipped: non-finite gradient norm{} (loss scale {})",
                 options_.compute_dtype == DType::kFloat16 ? " (fp16 overflow)" : "", scale);
  }
  // Gradients start from zero for the next accumulation cycle.
  if (per_micro_batch_grads()) {
    for (auto& s : units_) {
      if (s->grad_slice.empty()) continue;  // parameter offload: host_grad instead
      device_.fill_zero(s->grad_slice.device<std::byte>(),
                        static_cast<std::size_t>(s->grad_slice.bytes()), compute_);
    }
  } else {
    device_.fill_zero(full_grads_.device<std::byte>(),
                      static_cast<std::size_t>(full_grads_.bytes()), compute_);
  }
  if (options_.compute_dtype == DType::kFloat16) scaler_.update(!finite);
  micro_batch_ = 0;
  result.optimizer_steps = optimizer_steps_;
  result.skipped_steps = skipped_steps_;
  return result;
}

std::vector<float> ZeroEngine::full_parameter(int param) {
  const ParamPlacement& pl = plan_.placement(param);
  const Unit& unit = plan_.unit(pl.unit);
  UnitState& s = *units_[static_cast<std::size_t>(pl.unit)];
  std::vector<float> out(static_cast<std::size_t>(pl.numel));
  compute_.synchronize();
  if (cpu_optimizer_) cpu_optimizer_->synchronize();  // offload: the master is being written
  if (partition_world() == 1) {
    if (offload_optimizer()) {
      std::memcpy(out.data(), s.master.host<float>() + pl.offset, out.size() * 4);
      return out;
    }
    device_.copy_to_host(out.data(), s.master.device<std::byte>() + pl.offset * 4, out.size() * 4,
                         compute_);
    compute_.synchronize();
    return out;
  }
  Buffer full = device_.allocate(unit.numel * 4, MemCategory::kWorkspace, "full_parameter");
  if (offload_optimizer()) {
    device_.copy_to_device(full.device<std::byte>() + rank_ * unit.shard * 4, s.master.host<void>(),
                           static_cast<std::size_t>(unit.shard * 4), comm_);
  } else {
    device_.copy(full.device<std::byte>() + rank_ * unit.shard * 4, s.master.device<std::byte>(),
                 static_cast<std::size_t>(unit.shard * 4), comm_);
  }
  group_.all_gather(full.device<std::byte>() + rank_ * unit.shard * 4, full.device<std::byte>(),
                    unit.shard, DType::kFloat32);
  device_.copy_to_host(out.data(), full.device<std::byte>() + pl.offset * 4, out.size() * 4, comm_);
  comm_.synchronize();
  return out;
}

}  // namespace zrt
