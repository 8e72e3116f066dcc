// ZeroEngine's orchestration: construction, the model's acquire / release (each runs the
// schedule's operations for that call), and the step. What each operation does is in
// param_gather.cc, gradient_reduction.cc and unit_state.cc; the order is unit_schedule.cc's.
#include "runtime/engine/zero_engine.h"

#include <cmath>
#include <cstring>

#include <spdlog/spdlog.h>

#include "runtime/common/error.h"
#include "runtime/engine/engine_groups.h"
#include "runtime/engine/engine_kernels.h"
#include "runtime/engine/step_strategy.h"
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
                       DeviceOptimizer& optimizer, const OffloadFactory& offload,
                       ProcessGroup* replicas, QuantizedCollectives* quantized,
                       ProcessGroup* secondary)
    : ZeroEngine(device, compute, {ShardGroup{&group, replicas, quantized, secondary}},
                 std::move(params), num_modules, options, optimizer, offload) {}

ZeroEngine::ZeroEngine(Device& device, Stream& compute, std::vector<ShardGroup> groups,
                       std::vector<ParamSpec> params, int num_modules, const EngineOptions& options,
                       DeviceOptimizer& optimizer, const OffloadFactory& offload)
    : device_(device),
      compute_(compute),
      groups_(engine_groups::require_shard_groups(std::move(groups))),
      comm_(groups_.front().shard->stream()),
      params_(std::move(params)),
      num_modules_(num_modules),
      options_(options),
      optimizer_(optimizer),
      plan_(params_, engine_groups::partition_options(options, groups_, num_modules),
            engine_groups::group_worlds(options, groups_)),
      schedule_(plan_, num_modules,
                engine_groups::schedule_options(options, groups_, plan_, num_modules)),
      scaler_(options.loss_scale),
      unit_rank_(engine_groups::unit_ranks(plan_, options, groups_)),
      steps_not_taken_(params_.size(), 0) {
  // The options alone (engine_options.h, the rules the config layer reports too), then what
  // the engine was given for them.
  check_options(options);
  ZRT_CHECK(optimizer.spec().num_states() <= kMaxOptimizerStates,
            "optimizer {} keeps {} state tensors; slices carry at most {} (kMaxOptimizerStates)",
            optimizer.spec().family, optimizer.spec().num_states(), kMaxOptimizerStates);
  check_offload_factory(offload);
  engine_groups::check(options, groups_);
  comm_done_ = device_.create_event();
  compute_done_ = device_.create_event();
  decision_ready_ = device_.create_event();
  placement_ = unit_placements(options_, plan_);
  build_offload(offload);
  allocate_state();
  choose_strategies();
  const ShardGroup& dense = groups_.front();
  spdlog::debug("engine: stage {}, {}{}{}", options_.stage, plan_.describe(),
                dense.replicas != nullptr && dense.replicas->size() > 1
                    ? fmt::format(", shards replicated over {} groups", dense.replicas->size())
                    : "",
                dense.secondary != nullptr && options_.hpz_partition_size > 1
                    ? fmt::format(", hpZ secondary shards over {} ranks", dense.secondary->size())
                    : "");
}

ZeroEngine::~ZeroEngine() {
  try {
    // Every one, also after one fails: the others' work reads the buffers freed next.
    drain_each({[this] { wait_state_copy(); },  // the copy reads the state this frees
                [this] { step_->synchronize(); }, [this] { comm_.synchronize(); },
                [this] { compute_.synchronize(); }});
  } catch (const std::exception& e) {
    spdlog::warn("engine shut down after a stream error: {}", e.what());
  }
}

void ZeroEngine::synchronize() {
  drain_each({[this] { step_->synchronize(); }, [this] { comm_.synchronize(); },
              [this] { compute_.synchronize(); }});
}

DType ZeroEngine::comm_dtype() const {
  return options_.communication_dtype.value_or(options_.compute_dtype);
}

void ZeroEngine::wait_for_comm() {
  comm_done_->record(comm_);
  compute_.wait(*comm_done_);
}

ZeroEngine::OffloadStatus ZeroEngine::offload_status(int unit) const {
  ZRT_CHECK(offload_ != nullptr, "offload_status() without optimizer offload");
  return offload_->status(unit);
}

// ---- ParamAccess: the model's calls run the schedule ----------------------------------------

DevicePtr<std::byte> ZeroEngine::param(int index) {
  ZRT_CHECK(index >= 0 && index < static_cast<int>(params_.size()), "parameter index {}", index);
  const ParamPlacement& pl = plan_.placement(index);
  const Unit& unit = plan_.unit(pl.unit);
  const DType cdt = options_.compute_dtype;
  if (sharded_params() && !unit.persistent) {
    ZRT_CHECK(schedule_.gathered(pl.unit),
              "parameter '{}' used while no module using it is acquired",
              params_[static_cast<std::size_t>(index)].name);
    const UnitState& s = *units_[static_cast<std::size_t>(pl.unit)];
    return at(placement(pl.unit).gathered_in_place ? s.param_slice : s.gathered, pl.offset, cdt);
  }
  return full_params_of(pl.unit) + bytes_of(pl.offset, cdt);
}

void ZeroEngine::run(const UnitOp& op) {
  switch (op.kind) {
    case UnitOpKind::kIssueGather:
      issue_gather(op.unit);
      break;
    case UnitOpKind::kAwaitGather:
    case UnitOpKind::kAwaitPublish:  // the publication records the same event
      await_gather(op.unit);
      break;
    case UnitOpKind::kReleaseGather:
      release_gather(op.unit);
      break;
    case UnitOpKind::kFreeBucket:
      free_grad_bucket(op.unit);
      break;
    case UnitOpKind::kOpenBucket:
      open_grad_bucket(op.unit);
      break;
    case UnitOpKind::kIssueReduce:
      issue_reduce(op.unit, op.final);
      break;
    case UnitOpKind::kKeepSecondary:
      keep_secondary(op.unit);
      break;
    case UnitOpKind::kIssueSecondaryGather:
      issue_secondary_gather(op.unit);
      break;
    case UnitOpKind::kFreeSecondary:
      free_secondary(op.unit);
      break;
  }
}

void ZeroEngine::acquire(int module, Phase phase) {
  for (const UnitOp& op : schedule_.acquire(module, phase)) run(op);
  // The model's kernels for this module, until release().
  if (trace_ != nullptr) {
    compute_.trace_begin(*trace_, TraceTrack::kCompute,
                         std::string(phase_name(phase)) + " module " + std::to_string(module));
  }
}

void ZeroEngine::release(int module, Phase phase) {
  if (trace_ != nullptr) compute_.trace_end();
  for (const UnitOp& op : schedule_.release(module, phase)) run(op);
}

// ---- the step --------------------------------------------------------------------------------

StepResult ZeroEngine::step(double lr) {
  enqueue_step(lr);
  return settle_step();
}

bool ZeroEngine::decides_on_device() const {
  return decides_step_on_device(options_);
}

StepResult ZeroEngine::enqueue_step(double lr) {
  settle_step();  // the previous step: this one's bias correction counts the applied steps
  const int accumulation = options_.gradient_accumulation_steps;
  ZRT_CHECK(schedule_.micro_batch() == accumulation,
            "step() after {} micro-batches; gradient_accumulation_steps is {}",
            schedule_.micro_batch(), accumulation);
  ZRT_CHECK(schedule_.live_secondary_elements() == 0,
            "step() while hpZ secondary shards are alive: a training forward ran without its "
            "backward");
  const double scale = options_.compute_dtype == DType::kFloat16 ? scaler_.scale() : 1.0;
  const StepDecisionInputs inputs{accumulation * scale, options_.gradient_clipping};
  StepResult result;
  result.loss_scale = scale;

  if (decides_on_device()) {
    // The global decision where the norm is: the norm, the decision and its copy down on the
    // stream the norm is ready on; the optimizer (compute stream) reads the decision there.
    wait_for_comm();
    Stream& reader = enqueue_grad_norm_squared();
    engine_kernels::decide_step(device_, reader, norm_.device<float>(), inputs,
                                decision_.device<StepDecision>());
    device_.copy_to_host(norm_host_.host<void>(), norm_.device<std::byte>(), sizeof(float), reader);
    decision_ready_->record(reader);
    if (&reader == &comm_) compute_.wait(*decision_ready_);
    update_parameters(lr, optimizer_steps_ + 1, 1.0, decision_.device<StepDecision>());
    zero_grads();
    schedule_.step();
    result.decided = false;
    result.optimizer_steps = optimizer_steps_;
    result.skipped_steps = skipped_steps_;
    decision_pending_ = true;
    pending_inputs_ = inputs;
    last_step_ = result;
    return result;
  }

  // The global decision on the host: the squared norm of the whole gradient, summed over
  // ranks. The one host synchronisation of such a step.
  const float norm_squared = step_->norm_squared();
  const StepDecision decision = decide_step(norm_squared, inputs);
  if (decision.apply != 0) {
    update_parameters(lr, optimizer_steps_ + 1, static_cast<double>(decision.grad_scale), {});
  } else {
    step_->skip();
  }
  count_decided_step(result, norm_squared, inputs);
  zero_grads();
  if (options_.compute_dtype == DType::kFloat16) scaler_.update(decision.apply == 0);
  schedule_.step();
  last_step_ = result;
  return result;
}

StepResult ZeroEngine::settle_step() {
  if (!decision_pending_) return last_step_;
  decision_ready_->synchronize();  // the norm's copy down: an earlier point than the streams'
  decision_pending_ = false;
  float norm_squared = 0.0f;
  std::memcpy(&norm_squared, norm_host_.host<void>(), sizeof norm_squared);
  count_decided_step(last_step_, norm_squared, pending_inputs_);
  return last_step_;
}

void ZeroEngine::count_decided_step(StepResult& result, float norm_squared,
                                    const StepDecisionInputs& in) {
  result.decided = true;
  result.grad_norm = step_grad_norm(norm_squared, in);
  result.skipped = !std::isfinite(norm_squared);
  if (result.skipped) {
    ++skipped_steps_;
    spdlog::warn("step skipped: non-finite gradient norm{} (loss scale {})",
                 options_.compute_dtype == DType::kFloat16 ? " (fp16 overflow)" : "",
                 result.loss_scale);
  } else {
    ++optimizer_steps_;
  }
  result.optimizer_steps = optimizer_steps_;
  result.skipped_steps = skipped_steps_;
}

std::map<std::int64_t, std::vector<OptimizerDeviceSlice>> ZeroEngine::device_optimizer_slices() {
  // The units whose state is on the device (all without offload; with partial offload the
  // first units of the forward, so the next forward starts on them at once), by the steps
  // their parameters did not take.
  std::map<std::int64_t, std::vector<OptimizerDeviceSlice>> slices;
  for (std::size_t ui = 0; ui < units_.size(); ++ui) {
    const int u = static_cast<int>(ui);
    const Unit& unit = plan_.unit(u);
    if (placement_[ui].stepped_on_host() || unit.frozen) continue;
    UnitState& s = *units_[ui];
    DevicePtr<std::byte> out = owned_params_of(u);
    for (int p : unit.params) {
      const auto range = plan_.owned_range(p, slice_rank(u));
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
      slice.weight_decay = params_[static_cast<std::size_t>(p)].takes_weight_decay();
      slices[steps_not_taken_[static_cast<std::size_t>(p)]].push_back(slice);
    }
  }
  return slices;
}

void ZeroEngine::update_parameters(double lr, std::int64_t step, double grad_scale,
                                   DevicePtr<const StepDecision> decision) {
  order_update_after_state_copy();  // a checkpoint may still be copying the state out
  step_->update_on_host(step, lr, grad_scale);
  // One launch per own step count (one group unless a resume trains parameters that were
  // frozen: Adam counts each parameter's steps, EngineCounters::parameter_steps).
  const auto slices = device_optimizer_slices();
  if (!slices.empty()) {
    const std::string what = optimizer_trace_name() + step_->device_span_suffix();
    TraceSpan span(trace_, compute_, TraceTrack::kCompute, what.c_str());
    for (const auto& [not_taken, group] : slices) {
      optimizer_.step(group, step - not_taken, lr, compute_, grad_scale, decision);
    }
  }
  // Publish the updated parameters: stages 1-2 (and stage 3's persistent unit) gather them,
  // in the next forward's order; the compute stream waits for each unit in acquire().
  if (published_units_.empty()) return;
  if (!slices.empty() || all_units_on_device_) {  // after the device's update
    compute_done_->record(compute_);
    comm_.wait(*compute_done_);
  }
  publish_all_updated();
}

}  // namespace zrt
