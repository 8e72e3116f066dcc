// The engine's unit state: allocation, initialisation, loading and copying out (checkpoints,
// export). With optimizer offload the fp32 state lives in the offload's host memory and is
// read and written there; the compute-dtype parameters are on the device either way (or in
// host memory with parameter offload).
#include <algorithm>
#include <cctype>
#include <cstring>
#include <memory>

#include <spdlog/spdlog.h>

#include "runtime/common/error.h"
#include "runtime/device/host_memory.h"
#include "runtime/engine/engine_kernels.h"
#include "runtime/engine/step_strategy.h"
#include "runtime/engine/unit_state.h"

namespace zrt {

void ZeroEngine::allocate_state() {
  const DType cdt = options_.compute_dtype;
  const DType adt = options_.grad_accum_dtype;
  std::int64_t max_unit = 0;
  for (std::size_t u = 0; u < plan_.units().size(); ++u) {
    const Unit& unit = plan_.unit(static_cast<int>(u));
    auto s = std::make_unique<UnitState>();
    const std::string name = fmt::format("unit {}", u);
    // Where each buffer lives is the placement's (unit_placement.h): offloaded (optimizer
    // offload; with a ratio below 1 only some units), the fp32 state never touches the device.
    const UnitPlacement& where = placement(static_cast<int>(u));
    // The reductions' buffers are sized by the units reduced (a frozen one never is).
    if (!unit.frozen) max_unit = std::max(max_unit, unit.numel);
    if (where.master == Residence::kDevice) {
      s->master = device_.allocate(bytes_of(unit.shard, DType::kFloat32), MemCategory::kMaster,
                                   name + " fp32 master");
    }
    if (where.optimizer_state == Residence::kDevice) {
      for (const std::string& state : optimizer_.spec().state_names) {
        s->state.push_back(device_.allocate(bytes_of(unit.shard, DType::kFloat32),
                                            MemCategory::kOptimizer, name + " " + state));
      }
    }
    if (sharded_params()) {
      if (unit.persistent) {
        s->resident = device_.allocate(bytes_of(unit.numel, cdt), MemCategory::kParams,
                                       name + " persistent params");
      } else if (where.param_slice == Residence::kDevice) {
        // (offloaded, the slice is the offload's host_params)
        s->param_slice = device_.allocate(bytes_of(unit.shard, cdt), MemCategory::kParams,
                                          name + " param slice");
      }
    }
    // With parameter offload the gradient accumulates in host memory (in the offload); at one
    // micro-batch per step an offloaded unit's reduced slice goes there as it is
    // (offload_takes_reduced_slices).
    if (per_micro_batch_grads() && where.grad_slice == Residence::kDevice) {
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
    // The trained units' alone, one after the other (a frozen unit's gradient, which nobody
    // reads, goes to a bucket for its modules' backward: the schedule opens it at any stage).
    std::int64_t trained = 0;
    full_grad_offset_.clear();
    for (const Unit& unit : plan_.units()) {
      full_grad_offset_.push_back(unit.frozen ? -1 : trained);
      if (!unit.frozen) trained += unit.numel;
    }
    full_grads_ = device_.allocate(bytes_of(trained, adt), MemCategory::kGrads, "full gradients");
  }
  // Stages 2-3 convert every micro-batch's bucket to the communication dtype, even on one rank;
  // stages 0-1 convert only where there is a reduction.
  const DType reduced_type = per_micro_batch_grads() ? cdt : adt;
  bool converts = per_micro_batch_grads();
  for (std::size_t u = 0; u < plan_.units().size(); ++u) {
    const int unit = static_cast<int>(u);
    if (plan_.unit(unit).frozen) continue;
    converts = converts || shard_group_of(unit).size() > 1 || replicas_of(unit) != nullptr;
  }
  if (comm_dtype() != reduced_type && converts && max_unit > 0) {
    comm_scratch_ = device_.allocate(bytes_of(max_unit, comm_dtype()), MemCategory::kComm,
                                     "gradient conversion for communication_data_type");
  }
  if (options_.quantized_gradients) {
    std::int64_t max_shard = 0;
    for (const Unit& unit : plan_.units()) {
      if (!unit.frozen) max_shard = std::max(max_shard, unit.shard);
    }
    quantized_out_ = device_.allocate(bytes_of(max_shard, comm_dtype()), MemCategory::kComm,
                                      "quantized reduce-scatter output");
  }
  norm_ = device_.allocate(static_cast<std::int64_t>(sizeof(float) * groups_.size()),
                           MemCategory::kWorkspace, "gradient norm");
  if (decides_step_on_device(options_)) {
    decision_ = device_.allocate(sizeof(StepDecision), MemCategory::kWorkspace, "step decision");
    norm_host_ = device_.allocate(sizeof(float), MemCategory::kWorkspace, "gradient norm read back",
                                  MemorySpace::kPinnedHost);
  }
}

DevicePtr<std::byte> ZeroEngine::full_params_of(int u) {
  const Unit& unit = plan_.unit(u);
  if (sharded_params()) {
    ZRT_CHECK(unit.persistent, "unit {} has no resident full parameters at stage 3", u);
    return units_[static_cast<std::size_t>(u)]->resident.device<std::byte>();
  }
  return at(full_params_, unit.offset, options_.compute_dtype);
}

DevicePtr<std::byte> ZeroEngine::owned_params_of(int u) {
  const Unit& unit = plan_.unit(u);
  if (sharded_params() && !unit.persistent) {
    return units_[static_cast<std::size_t>(u)]->param_slice.device<std::byte>();
  }
  return full_params_of(u) + bytes_of(slice_rank(u) * unit.shard, options_.compute_dtype);
}

DevicePtr<std::byte> ZeroEngine::device_state(int u, std::size_t a) const {
  const UnitState& s = *units_[static_cast<std::size_t>(u)];
  return (a == 0 ? s.master : s.state[a - 1]).device<std::byte>();
}

// ---- initialisation and loading ---------------------------------------------------------------

void ZeroEngine::initialize(const Initializer& init) {
  assign_state(
      [&](int u, const StateArrays& arrays) {
        // assign_state() hands a zeroed master array (its padding stays zero) and, with
        // master_only, zeroes the optimizer state itself, on the device or in host memory.
        float* master = arrays[0];
        const Unit& unit = plan_.unit(u);
        for (int p : unit.params) {
          const auto range = plan_.owned_range(p, slice_rank(u));
          if (range.count == 0) continue;
          init(p, range.first, range.count, master + range.slice_offset);
        }
      },
      /*master_only=*/true);
}

void ZeroEngine::load_state(const EngineCounters& counters, const StateFiller& fill) {
  ZRT_CHECK(schedule_.micro_batch() == 0,
            "load_state() after {} micro-batches: only at a step boundary",
            schedule_.micro_batch());
  settle_step();  // a decision still on the device would count its step after the load
  // A frozen unit has no optimizer state (Unit::frozen): `fill` gets null for it and skips
  // the checkpoint's (its moments from a run that trained it, or zeros).
  // Every count checked before anything changes: a refused load leaves the engine as it was.
  ZRT_CHECK(counters.optimizer_steps >= 0, "{} optimizer steps", counters.optimizer_steps);
  ZRT_CHECK(counters.parameter_steps.empty() || counters.parameter_steps.size() == params_.size(),
            "{} parameter step counts for {} parameters", counters.parameter_steps.size(),
            params_.size());
  std::vector<std::int64_t> not_taken(params_.size(), 0);
  for (std::size_t p = 0; p < counters.parameter_steps.size(); ++p) {
    const std::int64_t taken = counters.parameter_steps[p];
    ZRT_CHECK(taken >= 0 && taken <= counters.optimizer_steps,
              "parameter '{}' took {} optimizer steps of the run's {}", params_[p].name, taken,
              counters.optimizer_steps);
    not_taken[p] = counters.optimizer_steps - taken;
  }
  assign_state(fill);
  optimizer_steps_ = counters.optimizer_steps;
  skipped_steps_ = counters.skipped_steps;
  scaler_.restore(counters.loss_scale);
  steps_not_taken_ = std::move(not_taken);
}

std::int64_t ZeroEngine::optimizer_steps() const {
  ZRT_CHECK(!decision_pending_,
            "optimizer_steps() while the last step's decision is still on the device: call "
            "settle_step() first");
  return optimizer_steps_;
}

EngineCounters ZeroEngine::counters() const {
  ZRT_CHECK(!decision_pending_,
            "counters() while the last step's decision is still on the device: call "
            "settle_step() first");
  EngineCounters c{optimizer_steps_, skipped_steps_, scaler_.state(), {}};
  for (std::size_t p = 0; p < params_.size(); ++p) {
    c.parameter_steps.push_back(params_[p].frozen ? 0 : optimizer_steps_ - steps_not_taken_[p]);
  }
  return c;
}

std::string ZeroEngine::optimizer_trace_name() const {
  std::string name = optimizer_.spec().family;
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name;
}

std::size_t ZeroEngine::held_state_arrays(int u) const {
  return plan_.unit(u).frozen ? 1 : static_cast<std::size_t>(state_array_count());
}

const float* ZeroEngine::frozen_state_zeros() {
  if (frozen_state_zeros_.data() == nullptr) {
    std::int64_t largest = 0;
    for (const Unit& unit : plan_.units()) {
      if (unit.frozen) largest = std::max(largest, unit.shard);
    }
    frozen_state_zeros_ =
        ZeroHostPages(static_cast<std::size_t>(bytes_of(largest, DType::kFloat32)));
  }
  return static_cast<const float*>(frozen_state_zeros_.data());
}

void ZeroEngine::check_state_arrays(const StateArrays& arrays, const char* call) const {
  const OptimizerSpec& spec = optimizer_.spec();
  ZRT_CHECK(static_cast<int>(arrays.size()) == state_array_count(),
            "{}: {} host arrays for {} state (master + {} state tensors expected)", call,
            arrays.size(), spec.family, spec.num_states());
}

void ZeroEngine::assign_state(const StateFiller& fill, bool master_only) {
  const DType cdt = options_.compute_dtype;
  // Nothing may still read or write the state being replaced.
  wait_state_copy();
  step_->synchronize();
  compute_.synchronize();
  comm_.synchronize();
  // Without offload, host_state[0] is the master weights, then one per optimizer state tensor,
  // on their way to the device: allocated for the largest unit so far, uninitialised (they are
  // zeroed on the host's threads before each unit).
  std::vector<std::unique_ptr<float[]>> host_state(static_cast<std::size_t>(state_array_count()));
  std::int64_t host_state_capacity = 0;
  StateArrays arrays(host_state.size());
  std::vector<std::byte> converted;  // an offloaded unit's compute-dtype copy on its way up
  for (std::size_t ui = 0; ui < units_.size(); ++ui) {
    const int u = static_cast<int>(ui);
    const Unit& unit = plan_.unit(u);
    UnitState& s = *units_[ui];
    if (state_on_host(u)) {
      // Host state: filled in place (a 7B model's is ~100 GB; a copy through temporaries doubled
      // the passes over it), zeroed and converted on the host's threads (on one, an 8B model's
      // start-up spent tens of seconds here); the compute-dtype copy goes up through a host
      // buffer.
      for (std::size_t a = 0; a < arrays.size(); ++a) {
        arrays[a] =
            a < held_state_arrays(u) ? offload_->state_array(u, static_cast<int>(a)) : nullptr;
        if (arrays[a] != nullptr) {
          parallel_fill_zero(arrays[a], static_cast<std::size_t>(unit.shard) * 4);
        }
      }
      fill(u, arrays);
      const float* master = arrays[0];
      // The slice itself in host memory (parameter offload): converted in place.
      if (placement(u).param_slice == Residence::kHost) {
        engine_kernels::cpu::convert_on_host_threads(master, DType::kFloat32,
                                                     offload_->host_params(u), cdt, unit.shard);
      } else {
        converted.resize(static_cast<std::size_t>(bytes_of(unit.shard, cdt)));
        engine_kernels::cpu::convert_on_host_threads(master, DType::kFloat32, converted.data(), cdt,
                                                     unit.shard);
        device_.copy_to_device(owned_params_of(u), converted.data(), converted.size(), compute_);
        compute_.synchronize();  // `converted` is reused by the next unit
      }
    } else {
      // With master_only the state tensors are zeroed where they live, not zeroed here and
      // copied up: a third of the bytes (Adam). `fill` gets no array for them, nor for a frozen
      // unit's, which has none.
      const std::size_t filled = master_only ? 1 : held_state_arrays(u);
      if (unit.shard > host_state_capacity) {
        host_state_capacity = unit.shard;
        for (std::size_t a = 0; a < (master_only ? 1 : host_state.size()); ++a) {
          host_state[a].reset(new float[static_cast<std::size_t>(host_state_capacity)]);
        }
      }
      for (std::size_t a = 0; a < host_state.size(); ++a) {
        arrays[a] = a < filled ? host_state[a].get() : nullptr;
        if (a < filled) parallel_fill_zero(arrays[a], static_cast<std::size_t>(unit.shard) * 4);
      }
      fill(u, arrays);
      for (std::size_t a = 0; a < host_state.size(); ++a) {
        if (a < filled) {
          device_.copy_to_device(device_state(u, a), host_state[a].get(),
                                 static_cast<std::size_t>(unit.shard) * 4, compute_);
        } else if (a < held_state_arrays(u)) {
          device_.fill_zero(device_state(u, a), static_cast<std::size_t>(unit.shard) * 4, compute_);
        }
      }
      compute_.synchronize();  // the host vectors are reused for the next unit
      // The compute-dtype copy of the owned slice.
      engine_kernels::convert(device_, compute_, s.master.device<std::byte>(), DType::kFloat32,
                              owned_params_of(u), cdt, unit.shard);
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
  // Every rank holds its slice; stages 1-2 (and stage 3's persistent unit) need full copies,
  // published in unit order (a frozen unit's too: only after a step it is not).
  const bool publishes = std::any_of(units_.begin(), units_.end(),
                                     [](const auto& s) { return s->publish != nullptr; });
  if (publishes) {
    compute_done_->record(compute_);
    comm_.wait(*compute_done_);
    for (std::size_t ui = 0; ui < units_.size(); ++ui) {
      if (units_[ui]->publish != nullptr) publish_updated(static_cast<int>(ui), nullptr);
    }
    wait_for_comm();
  }
  compute_.synchronize();
  comm_.synchronize();
}

// ---- copying the state out (checkpoints, export) ----------------------------------------------

void ZeroEngine::copy_state_out(int u, const StateArrays& out) {
  ZRT_CHECK(schedule_.micro_batch() == 0,
            "copy_state_out() after {} micro-batches: only at a step boundary",
            schedule_.micro_batch());
  check_state_arrays(out, "copy_state_out()");
  const std::size_t bytes = static_cast<std::size_t>(plan_.unit(u).shard) * 4;
  // The optimizer state a frozen unit does not hold is zeros (a checkpoint resumed with it
  // trained starts its moments there).
  const std::size_t held = held_state_arrays(u);
  for (std::size_t a = held; a < out.size(); ++a) std::memset(out[a], 0, bytes);
  if (state_on_host(u)) {
    offload_->synchronize();  // the CPU optimizer may still be writing the state
    for (std::size_t a = 0; a < held; ++a) {
      std::memcpy(out[a], offload_->state_array(u, static_cast<int>(a)), bytes);
    }
    return;
  }
  for (std::size_t a = 0; a < held; ++a) {
    device_.copy_to_host(out[a], device_state(u, a), bytes, compute_);
  }
  compute_.synchronize();
}

std::vector<std::vector<const float*>> ZeroEngine::host_state() {
  ZRT_CHECK(schedule_.micro_batch() == 0,
            "host_state() after {} micro-batches: only at a step boundary",
            schedule_.micro_batch());
  const std::size_t arrays = static_cast<std::size_t>(state_array_count());
  std::vector<std::vector<const float*>> out(units_.size());
  step_->synchronize();  // the CPU optimizer may still be writing the state
  for (std::size_t u = 0; u < units_.size(); ++u) {
    const int unit = static_cast<int>(u);
    for (std::size_t a = 0; a < arrays; ++a) {
      if (a >= held_state_arrays(unit)) {
        out[u].push_back(frozen_state_zeros());  // a frozen unit holds no optimizer state
        continue;
      }
      if (state_on_host(unit)) {
        out[u].push_back(offload_->state_array(unit, static_cast<int>(a)));
        continue;
      }
      const void* p = device_.host_address(device_state(unit, a));
      if (p == nullptr) return {};  // in a GPU's memory
      out[u].push_back(static_cast<const float*>(p));
    }
  }
  compute_.synchronize();  // the last optimizer step's device updates are enqueued there
  return out;
}

void ZeroEngine::copy_state_out_async(const StateArrays& out, std::function<void()> before) {
  ZRT_CHECK(schedule_.micro_batch() == 0,
            "copy_state_out_async() after {} micro-batches: only at a step boundary",
            schedule_.micro_batch());
  check_state_arrays(out, "copy_state_out_async()");
  const std::size_t arrays = out.size();
  std::vector<std::int64_t> offsets;  // where each unit's slice starts in the host arrays
  std::vector<std::size_t> bytes;     // each unit's slice
  std::int64_t at = 0;
  for (std::size_t u = 0; u < units_.size(); ++u) {
    offsets.push_back(at);
    at += plan_.unit(static_cast<int>(u)).shard;
    bytes.push_back(static_cast<std::size_t>(plan_.unit(static_cast<int>(u)).shard) * 4);
  }
  // A frozen unit's optimizer state, which it does not hold, is zeros, written with the copies
  // (not on this thread: a frozen embedding's are GBs); nothing else writes those ranges.
  const auto held = [this](std::size_t u) { return held_state_arrays(static_cast<int>(u)); };
  std::vector<std::pair<float*, std::size_t>> zeros;
  for (std::size_t u = 0; u < units_.size(); ++u) {
    for (std::size_t a = held(u); a < arrays; ++a) {
      zeros.emplace_back(out[a] + offsets[u], bytes[u]);
    }
  }
  const auto write_zeros = [zeros] {
    for (const auto& [at, count] : zeros) std::memset(at, 0, count);
  };
  bool on_device = false;
  std::vector<std::size_t> host_units;
  std::vector<const float*> sources;  // per host unit, `arrays` entries (null: not held)
  for (std::size_t u = 0; u < units_.size(); ++u) {
    if (!state_on_host(static_cast<int>(u))) {
      on_device = true;
      continue;
    }
    host_units.push_back(u);
    for (std::size_t a = 0; a < arrays; ++a) {
      sources.push_back(
          a < held(u) ? offload_->state_array(static_cast<int>(u), static_cast<int>(a)) : nullptr);
    }
  }
  if (!host_units.empty()) {
    // Host state, written only by the CPU optimizer's thread: the copy goes after its last
    // update in that thread's queue, and the next step's updates after the copy.
    // `before` runs once, ahead of the first copy: here, or on the device copy's stream below.
    std::function<void()> host_before = on_device ? std::function<void()>{} : std::move(before);
    host_state_copied_ = offload_->run_between_updates([=, before = std::move(host_before)] {
      if (before) before();
      for (std::size_t i = 0; i < host_units.size(); ++i) {
        const std::size_t u = host_units[i];
        for (std::size_t a = 0; a < arrays; ++a) {
          const float* source = sources[arrays * i + a];
          if (source != nullptr) std::memcpy(out[a] + offsets[u], source, bytes[u]);
        }
      }
      write_zeros();
    });
    if (!on_device) return;
  }
  // Device-resident state (all of it without offload; with partial offload the units the
  // device steps), copied on a stream of its own after the last update on the compute stream.
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
    if (state_on_host(static_cast<int>(u))) continue;
    for (std::size_t a = 0; a < held(u); ++a) {
      device_.copy_to_host(out[a] + offsets[u], device_state(static_cast<int>(u), a), bytes[u],
                           stream);
    }
  }
  if (host_units.empty() && !zeros.empty()) stream.host_callback(write_zeros);
  state_copied_->record(stream);
}

void ZeroEngine::wait_state_copy() {
  if (state_copied_) state_copied_->synchronize();
  if (host_state_copied_.valid()) host_state_copied_.get();
}

void ZeroEngine::order_update_after_state_copy() {
  // The offloaded copy is ordered by the CPU optimizer's queue (run_between_updates); the
  // device-resident state's copy (none with full offload) by its event.
  if (state_copied_) compute_.wait(*state_copied_);
}

std::vector<float> ZeroEngine::full_parameter(int param) {
  const ParamPlacement& pl = plan_.placement(param);
  const Unit& unit = plan_.unit(pl.unit);
  std::vector<float> out(static_cast<std::size_t>(pl.numel));
  compute_.synchronize();
  step_->synchronize();  // the master is being written
  const float* host_master = nullptr;
  if (state_on_host(pl.unit)) {
    host_master = offload_->state_array(pl.unit, 0);
  }
  ProcessGroup& group = shard_group_of(pl.unit);
  // Not sliced (every rank holds the whole unit, or its group has one rank): no gather.
  if (unit.shard == unit.numel) {
    if (host_master != nullptr) {
      std::memcpy(out.data(), host_master + pl.offset, out.size() * 4);
      return out;
    }
    device_.copy_to_host(out.data(), device_state(pl.unit, 0) + pl.offset * 4, out.size() * 4,
                         compute_);
    compute_.synchronize();
    return out;
  }
  Buffer full = device_.allocate(unit.numel * 4, MemCategory::kWorkspace, "full_parameter");
  // A failed gather (a timeout, a sequence mismatch) throws with the copies into `full` and
  // `out` still queued on comm_: they finish before either is freed.
  DrainOnUnwind drain(comm_);
  DevicePtr<std::byte> mine = full.device<std::byte>() + slice_rank(pl.unit) * unit.shard * 4;
  if (host_master != nullptr) {
    device_.copy_to_device(mine, host_master, static_cast<std::size_t>(unit.shard * 4), comm_);
  } else {
    device_.copy(mine, device_state(pl.unit, 0), static_cast<std::size_t>(unit.shard * 4), comm_);
  }
  group.all_gather(mine, full.device<std::byte>(), unit.shard, DType::kFloat32);
  device_.copy_to_host(out.data(), full.device<std::byte>() + pl.offset * 4, out.size() * 4, comm_);
  comm_.synchronize();
  return out;
}

}  // namespace zrt
