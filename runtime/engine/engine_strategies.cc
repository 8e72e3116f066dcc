// The engine's paths, chosen once when it is built: what the stage, the offload and ZeRO++'s
// switches mean for each unit is decided here, and the step only calls the objects picked
// (gather_strategy.h, reduce_strategy.h, step_strategy.h). Like the placement
// (unit_placement.h), the choice is per unit: with partial offload some units are stepped on
// the host and the rest on the device, and each unit reduces over its own group.
#include <algorithm>

#include <spdlog/spdlog.h>

#include "runtime/common/error.h"
#include "runtime/engine/step_strategy.h"
#include "runtime/engine/unit_state.h"

namespace zrt {

void ZeroEngine::check_offload_factory(const OffloadFactory& offload) const {
  ZRT_CHECK(!offload_optimizer() || offload,
            "offload_optimizer is enabled but the engine was given no offload implementation "
            "(pass offload/'s make_cpu_optimizer_offload)");
}

void ZeroEngine::build_offload(const OffloadFactory& offload) {
  if (!offload_optimizer()) return;
  offload_ = offload(OffloadContext{device_, comm_, plan_, params_, options_, optimizer_,
                                    state_rank(), unit_rank_, placement_});
  const double ratio = options_.offload_optimizer.ratio;
  if (ratio < 1.0 && groups_.front().shard->rank() == 0) {  // the same split on every rank
    // Of the trained units (a frozen unit's master weights are in host memory regardless).
    std::int64_t host = 0, trained = 0;
    int units = 0, trained_units = 0;
    for (std::size_t u = 0; u < placement_.size(); ++u) {
      const Unit& unit = plan_.unit(static_cast<int>(u));
      if (unit.frozen) continue;
      trained += unit.shard;
      ++trained_units;
      if (!placement_[u].stepped_on_host()) continue;
      host += unit.shard;
      ++units;
    }
    spdlog::info(
        "partial optimizer offload (ratio {}): {} of {} trained units, {:.1f}% of their state, "
        "in host memory; the rest steps on the device",
        ratio, units, trained_units,
        100.0 * static_cast<double>(host) /
            static_cast<double>(std::max<std::int64_t>(trained, 1)));
  }
}

void ZeroEngine::set_trace(TraceRecorder* recorder) {
  trace_ = recorder;
  step_->set_trace(recorder);
}

void ZeroEngine::choose_strategies() {
  const DType cdt = options_.compute_dtype;
  if (offload_) {
    step_ = std::make_unique<OffloadStep>(*this, *offload_);
  } else {
    step_ = std::make_unique<DeviceStep>(*this);
  }
  const auto own_gather = [this](std::unique_ptr<GatherStrategy> g) {
    gathers_.push_back(std::move(g));
    return gathers_.back().get();
  };
  const auto own_collective = [this](std::unique_ptr<GradientCollective> c) {
    collectives_.push_back(std::move(c));
    return collectives_.back().get();
  };
  const auto own_sink = [this](std::unique_ptr<GradientSink> s) {
    sinks_.push_back(std::move(s));
    return sinks_.back().get();
  };

  // Per group: its plain all-gather (stage 3's gathers, every publication), ZeRO++'s gathers,
  // and its gradients' collective.
  std::vector<GatherStrategy*> plain, quantized, host_slices, secondary;
  std::vector<GradientCollective*> collective;
  for (const ShardGroup& g : groups_) {
    plain.push_back(own_gather(make_all_gather(*g.shard, cdt)));
    quantized.push_back(options_.quantized_weights && g.quantized != nullptr
                            ? own_gather(make_quantized_gather(*g.quantized, cdt))
                            : nullptr);
    host_slices.push_back(offload_param() && offload_ ? own_gather(make_host_slice_gather(
                                                            device_, *offload_, *g.shard, cdt))
                                                      : nullptr);
    // (None for a group read in place: its units are whole on the rank, hpz_secondary_ranks.)
    secondary.push_back(
        options_.hpz_partition_size > 1 && g.secondary != nullptr &&
                hpz_secondary_ranks(options_, g.shard->size(), g.secondary->size()) > 0
            ? own_gather(make_secondary_gather(*g.secondary, cdt))
            : nullptr);
    ProcessGroup* replicas = g.replicas != nullptr && g.replicas->size() > 1 ? g.replicas : nullptr;
    if (options_.stage == 0) {
      collective.push_back(g.shard->size() > 1 || replicas != nullptr
                               ? own_collective(make_all_reduce(*g.shard))
                               : own_collective(make_no_reduction("all_reduce")));
    } else if (options_.stage == 1 || !per_micro_batch_grads()) {
      // (Stages 2-3 at a run of one rank accumulate full gradients: nothing to reduce them with.)
      collective.push_back(g.shard->size() > 1 || replicas != nullptr
                               ? own_collective(make_reduce_scatter(*g.shard, replicas))
                               : own_collective(make_no_reduction("reduce_scatter")));
    } else if (options_.quantized_gradients) {
      collective.push_back(own_collective(make_quantized_reduce_scatter(
          *g.quantized, replicas, quantized_out_.device<std::byte>())));
    } else {
      // Stages 2-3 reduce every bucket, one rank included (its slice is the whole bucket).
      collective.push_back(own_collective(make_reduce_scatter(*g.shard, replicas)));
    }
    if (g.gradient_scale != 1.0f) {  // expert units (ShardGroup::gradient_scale)
      collective.back() =
          own_collective(make_scaled(*collective.back(), device_, comm_, g.gradient_scale));
    }
  }

  // The sinks of the reduced slices.
  GradientSink* full_gradients = own_sink(make_full_gradient_sink(offload_.get()));
  GradientSink* device_accumulation = own_sink(make_device_accumulation(device_, offload_.get()));
  GradientSink* host_accumulation =
      offload_param() && offload_ ? own_sink(make_host_accumulation(*offload_)) : nullptr;
  GradientSink* reduced_to_host =
      offload_ ? own_sink(make_reduced_slice_to_host(*offload_)) : nullptr;

  for (std::size_t ui = 0; ui < units_.size(); ++ui) {
    const int u = static_cast<int>(ui);
    const Unit& unit = plan_.unit(u);
    const auto g = static_cast<std::size_t>(unit.group);
    UnitState& s = *units_[ui];
    if (sharded_params() && !unit.persistent) {
      // Parameter offload's host slices first (a unit whose slice is in host memory), then qwZ.
      if (offload_ && offload_->host_params(u) != nullptr) {
        s.gather = host_slices[g];
      } else if (quantized[g] != nullptr) {
        s.gather = quantized[g];
      } else {
        s.gather = plain[g];
      }
      s.secondary_gather = secondary[g];
      // hpZ's secondary shards split a group of several ranks; a unit read in place has none.
      ZRT_CHECK(!placement(u).gathered_in_place || s.secondary_gather == nullptr,
                "unit {}: read in place from its slice but given hpZ's secondary gather", u);
    } else if (options_.stage >= 1) {
      s.publish = plain[g];
    }
    if (unit.frozen) {
      // Never reduced, stepped, or published after a step (nothing changes it); gathered at
      // stage 3 and published once at stages 1-2 (assign_state) like any unit.
      continue;
    }
    s.reduce = collective[g];
    if (!per_micro_batch_grads()) {
      s.sink = full_gradients;
    } else if (offload_param()) {
      s.sink = host_accumulation;
    } else if (s.grad_slice.empty()) {
      s.sink = reduced_to_host;  // offload_takes_reduced_slices
    } else {
      s.sink = device_accumulation;
    }
    ZRT_CHECK(s.sink != nullptr, "unit {}: no sink for its reduced gradient slice", u);
    if (state_on_host(u)) s.params_ready = &offload_->params_ready(u);
    all_units_on_device_ = all_units_on_device_ && !state_on_host(u);
  }
  for (int u : UnitSchedule::forward_order(plan_)) {
    if (units_[static_cast<std::size_t>(u)]->publish != nullptr && !plan_.unit(u).frozen) {
      published_units_.push_back(u);
    }
  }
}

}  // namespace zrt
