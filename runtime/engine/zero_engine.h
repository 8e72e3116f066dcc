// ZeroEngine: ZeRO stages 0-3 over units (partition.h), model-agnostic. It owns every piece of
// model state a rank holds — compute-dtype parameters (full or sliced), gradients, fp32 master
// weights and the optimizer's named state tensors of its slices (optimizer_interface.h: Adam's
// two moments, Lion's momentum) — and implements ParamAccess for the model.
//
// Per micro-batch the model runs forward/backward bracketed by acquire()/release(); after
// gradient_accumulation_steps micro-batches the trainer calls step(). Communication runs on
// the process group's stream, ordered against the compute stream by events only: the one host
// synchronisation in a step is the global decision (gradient norm, overflow) in step().
//
// The engine's files, by what they do:
//   unit_schedule.*       the pure schedule: which units to gather, release, reduce, per call
//   zero_engine.cc        the orchestration: acquire / release run the schedule; step()
//   param_gather.cc       issue_gather / await_gather / release_gather, hpZ's secondary shards,
//                         and publishing the updated parameters after a step (stages 1-2)
//   gradient_reduction.cc gradient buckets, issue_reduce / await_reduce, the gradient norm
//   unit_state.*          each unit's buffers: allocate, initialise, load, copy out (export)
//   engine_strategies.cc  the paths chosen once, when the engine is built, from the stage, the
//                         offload and ZeRO++'s switches: each unit's gather (gather_strategy.*),
//                         reduction and sink of its reduced slice (reduce_strategy.*), and where
//                         the optimizer steps (step_strategy.*); the step only calls them
// Optimizer offload is a seam (optimizer_offload.h), implemented above the runtime (offload/).
//
// Thread-safety: one thread drives the engine (the thread that owns the compute stream).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include <future>

#include "runtime/comm/process_group.h"
#include "runtime/comm/quantized_collectives.h"
#include "runtime/comm/shard_group.h"
#include "runtime/device/host_memory.h"
#include "runtime/engine/engine_options.h"
#include "runtime/engine/gather_strategy.h"
#include "runtime/engine/loss_scaler.h"
#include "runtime/engine/optimizer_interface.h"
#include "runtime/engine/optimizer_offload.h"
#include "runtime/engine/partition.h"
#include "runtime/engine/reduce_strategy.h"
#include "runtime/engine/step_decision.h"
#include "runtime/engine/unit_placement.h"
#include "runtime/engine/unit_schedule.h"
#include "runtime/model_interface.h"
#include "runtime/trace/trace_recorder.h"

namespace zrt {

// The engine's counters at a step boundary (checkpointed with the optimizer state).
struct EngineCounters {
  std::int64_t optimizer_steps = 0;  // applied steps (the schedule's step count)
  std::int64_t skipped_steps = 0;
  LossScaleState loss_scale;
  // Per parameter (the engine's order), the optimizer steps it took: Adam's bias-correction
  // count, which each parameter keeps as PyTorch's per-parameter state['step']. It is
  // optimizer_steps unless the parameter's optimizer state started from zero later: a
  // parameter frozen when its checkpoint was saved (whose state it holds as zeros) and trained
  // after the resume counts from 0 there, so its first update is Adam's first, not one damped
  // for a state it never had. 0 for a frozen parameter. Empty on a load: optimizer_steps for
  // every parameter (a checkpoint written before the counts existed).
  std::vector<std::int64_t> parameter_steps;
};

struct StepResult {
  // false: enqueue_step() left the decision on the device; grad_norm and skipped are not known
  // yet and the counters are those before the step (settle_step() gives them).
  bool decided = true;
  bool skipped = false;              // non-finite gradients (or fp16 overflow): no update anywhere
  double grad_norm = 0.0;            // global L2 norm of the (unscaled, averaged) gradient
  double loss_scale = 1.0;           // the scale the step's gradients were computed with
  std::int64_t optimizer_steps = 0;  // successful steps so far
  std::int64_t skipped_steps = 0;
};

class ZeroEngine final : public ParamAccess {
 public:
  // `groups` is the table of shard groups the units live over (shard_group.h): each parameter's
  // unit is sliced, reduced and norm-summed over groups[ParamSpec::group]; the trainer's comes
  // from ParallelLayout::engine_groups(). Every group issues on one communication stream (the
  // first shard group's); `compute` is the model's stream. All must outlive the engine.
  // `offload` builds the optimizer offload when options.offload_optimizer is enabled
  // (offload/'s make_cpu_optimizer_offload); without one such options are refused.
  //
  // Hierarchical sharding (MiCS, HSDP): a group's `shard` is then the shard group the state is
  // sliced over (S ranks, typically one node), and its `replicas` the ranks that hold the same
  // slices in the other shard groups (N / S of them, one per group). Every reduced gradient
  // slice is averaged over the replicas after its reduce-scatter, so only 1/S of the gradient
  // crosses between shard groups, and the gathers stay inside the shard group. `quantized`
  // carries the quantized gathers / reductions when options ask for them; it works over
  // `shard`.
  //
  // hpZ (options.hpz_partition_size S > 1): `secondary` is this rank's group of S ranks that
  // share secondary shards (topology.h's shard_plan(N, S, rank): S consecutive ranks, which
  // must lie on one node by its node map).
  //
  // Several groups (units of some parameters over another group, like an expert's over the
  // expert-data-parallel group): stages 1-3, without hpZ; under ZeRO++'s qwZ / qgZ every group
  // brings its own QuantizedCollectives (ShardGroup::quantized). Checkpoints
  // record each unit's own slicing (runtime/checkpoint/, docs/checkpoints.md).
  ZeroEngine(Device& device, Stream& compute, std::vector<ShardGroup> groups,
             std::vector<ParamSpec> params, int num_modules, const EngineOptions& options,
             DeviceOptimizer& optimizer, const OffloadFactory& offload = {});
  // One group: `group` (the shard group), and the optional `replicas`, `quantized` and
  // `secondary` of its ShardGroup.
  ZeroEngine(Device& device, Stream& compute, ProcessGroup& group, std::vector<ParamSpec> params,
             int num_modules, const EngineOptions& options, DeviceOptimizer& optimizer,
             const OffloadFactory& offload = {}, ProcessGroup* replicas = nullptr,
             QuantizedCollectives* quantized = nullptr, ProcessGroup* secondary = nullptr);
  ~ZeroEngine() override;
  ZeroEngine(const ZeroEngine&) = delete;
  ZeroEngine& operator=(const ZeroEngine&) = delete;

  // Sets the initial parameters. init(param, first, count, out) writes elements
  // [first, first + count) of parameter `param` as fp32 into out (host memory); each rank
  // asks only for what it holds, so the initial model must not depend on the world size.
  using Initializer =
      std::function<void(int param, std::int64_t first, std::int64_t count, float* out)>;
  void initialize(const Initializer& init);

  // ---- checkpoints (at a step boundary, device- or host-resident state alike) ----
  // The optimizer state as host arrays: [0] the fp32 master weights, then one array per state
  // tensor of optimizer_spec(), in its state_names order (Adam: master, exp_avg, exp_avg_sq;
  // Lion: master, exp_avg). state_array_count() entries.
  using StateArrays = std::vector<float*>;
  const OptimizerSpec& optimizer_spec() const { return optimizer_.spec(); }
  int state_array_count() const { return 1 + optimizer_.spec().num_states(); }
  // Copies this rank's slice of unit u's state into host memory (plan().unit(u).shard floats
  // per array, padding included; zeros for a frozen unit's optimizer state, which it does not
  // hold: Unit::frozen). Synchronises.
  void copy_state_out(int u, const StateArrays& out);
  // The same copy without stopping training: issues the copies of every unit's slices (unit
  // order, plan().unit(u).shard floats each) into host arrays of plan().total_shard() floats
  // and returns at once. Device-resident state is copied on a stream of the engine's own,
  // ordered after the last optimizer step by an event (on a GPU a DMA, into pinned memory for
  // full speed); offloaded state is copied by the CPU optimizer's thread after its last update.
  // The engine itself keeps the state unchanged until the copy is done, so no caller can forget
  // it: step() orders its update after the copy (a stream wait, not a host wait), and
  // load_state(), initialize() and the destructor wait for it. The host arrays must stay valid
  // until wait_state_copy() returns. `before`, if set, runs on the copy's stream first (tests
  // delay the copy with it; it must not call the stream API).
  void copy_state_out_async(const StateArrays& out, std::function<void()> before = {});
  // Blocks until the last copy_state_out_async() is done (at once if none); rethrows a stream
  // error. May be called from another thread (a checkpoint writer) while the engine's thread
  // goes on training, up to its next copy_state_out_async().
  void wait_state_copy();
  // This rank's state where it lives, when the host can read it in place (the CPU device, or
  // optimizer offload's host state): [u][a] points at plan().unit(u).shard floats of state array
  // a of unit u (StateArrays order; a frozen unit's optimizer state: zeros backed by no memory).
  // Empty when the state is in a GPU's memory. Waits for the last update first; the memory holds
  // this state until the next step(), load_state() or initialize(). Only at a step boundary. A
  // synchronous checkpoint writes from it, no copy.
  std::vector<std::vector<const float*>> host_state();
  // The counters at a settled step boundary: throws while enqueue_step()'s decision is still on
  // the device (settle_step() first).
  EngineCounters counters() const;
  // The applied steps alone (counters().optimizer_steps, without the per-parameter counts).
  std::int64_t optimizer_steps() const;
  // Replaces the optimizer state: fill(u, arrays) writes this rank's slice of every unit into
  // the state_array_count() host arrays (shard floats each, all zero, to be left zero in the
  // padding; a frozen unit's optimizer state arrays are null: it holds none); the compute-dtype
  // parameters are re-derived from the master weights and gathered where the stage keeps full
  // copies. Collective at stages 1-3; the counters (step count, loss scaler) are restored.
  using StateFiller = std::function<void(int u, const StateArrays& arrays)>;
  void load_state(const EngineCounters& counters, const StateFiller& fill);
  // The slice this rank owns of group 0's units (0 at stage 0); slice_rank(u) for any unit.
  int state_rank() const;
  int slice_rank(int u) const { return unit_rank_[static_cast<std::size_t>(u)]; }
  const std::vector<ShardGroup>& groups() const { return groups_; }

  // ParamAccess.
  void acquire(int module, Phase phase) override;
  void release(int module, Phase phase) override;
  DevicePtr<std::byte> param(int index) override;
  DevicePtr<std::byte> grad(int index) override;
  bool trains(int index) const override { return !params_[static_cast<std::size_t>(index)].frozen; }
  int first_backward_module() const override { return schedule_.options().first_backward_module; }
  DType compute_dtype() const override { return options_.compute_dtype; }
  DType grad_dtype() const override;

  // The loss scale the model must multiply its loss gradient by (1 without fp16).
  double loss_scale() const {
    return options_.compute_dtype == DType::kFloat16 ? scaler_.scale() : 1.0;
  }
  // At the accumulation boundary (after gradient_accumulation_steps micro-batches): reduces
  // what is left, takes the global decision, clips, steps the optimizer on the owned slices and
  // makes the updated parameters available for the next forward. step() is enqueue_step() and
  // settle_step(): its result is decided, at the cost of one host wait for the gradient norm.
  StepResult step(double lr);
  // The same step with no host wait where the decision can be taken on the device
  // (decides_on_device()): the norm is summed, the decision taken (step_decision.h) and the
  // update enqueued there, and the optimizer kernels read the decision when they run. The
  // result comes back undecided; settle_step() reads the norm later, and the next
  // enqueue_step() does so first (Adam's bias correction counts applied steps). On a GPU that
  // read waits for nothing: the norm preceded everything enqueued since. Elsewhere this is
  // step(). A skipped step changes no parameter or state either way; on the device path its
  // updated parameters are still published (gathered unchanged), so only the traffic differs.
  StepResult enqueue_step(double lr);
  // The latest step's result, decided: waits for its norm if enqueue_step() left it on the
  // device (an event wait for that point, not for the streams), then counts the step applied or
  // skipped. Idempotent; before any step, a default result.
  StepResult settle_step();
  // Whether enqueue_step() decides on the device (decides_step_on_device(options())).
  bool decides_on_device() const;

  // The full fp32 master value of a parameter, gathered to every rank (collective; tests and
  // export). Synchronises.
  std::vector<float> full_parameter(int param);
  const PartitionPlan& plan() const { return plan_; }
  const std::vector<ParamSpec>& params() const { return params_; }
  const EngineOptions& options() const { return options_; }
  int micro_batches_done() const { return schedule_.micro_batch(); }
  const LossScaler& loss_scaler() const { return scaler_; }

  // Offload introspection (tests, tracing): the copy stream, and where a unit's last update is.
  Stream* copy_stream() const { return offload_ ? &offload_->copy_stream() : nullptr; }
  using OffloadStatus = OptimizerOffload::Status;
  OffloadStatus offload_status(int unit) const;
  // Where unit u's buffers live (unit_placement.h), and whether its fp32 state is in the
  // offload's host memory (every unit with full optimizer offload, the last ones of the forward
  // with offload_optimizer.ratio < 1, none without).
  const UnitPlacement& placement(int u) const { return placement_[static_cast<std::size_t>(u)]; }
  bool state_on_host(int u) const { return placement(u).stepped_on_host(); }

  // Timeline trace: from now on, the engine's work on every stream is recorded into `recorder`
  // as named spans ("forward module 2", "reduce_scatter unit 3", "d2h unit 3", "adam unit 3",
  // "h2d unit 3", "all_gather unit 3"); null stops recording (the default: then tracing costs a
  // null check). Call between micro-batches or steps. The recorder must outlive the work
  // enqueued while it was set: synchronize() before destroying or writing it.
  void set_trace(TraceRecorder* recorder);
  // Blocks until all work the engine enqueued (compute, communication, copies, CPU optimizer)
  // has finished; rethrows a stream error.
  void synchronize();

 private:
  struct UnitState;
  // Where the optimizer steps (step_strategy.h): all units on the device, or with the offload.
  class StepStrategy;
  class DeviceStep;
  class OffloadStep;
  // Whether any unit is sliced over more than one rank (false at stage 0).
  bool sliced() const;
  // The group's norm peers (ShardGroup::norm_peers) when they are more than this rank, else null;
  // whether any group has some.
  ProcessGroup* norm_peers_of(std::size_t g) const;
  bool has_norm_peers() const;
  // Unit u's groups: its shard group, and its replica group where it has one of several ranks.
  const ShardGroup& group_of(int u) const {
    return groups_[static_cast<std::size_t>(plan_.unit(u).group)];
  }
  ProcessGroup& shard_group_of(int u) const { return *group_of(u).shard; }
  ProcessGroup* replicas_of(int u) const;
  DType comm_dtype() const;
  bool sharded_params() const { return options_.stage == 3; }
  // The schedule's: stages 2-3, unless one rank accumulates full gradients
  // (per_micro_batch_grads in engine_options.h).
  bool per_micro_batch_grads() const { return schedule_.per_micro_batch_grads(); }
  bool offload_optimizer() const { return options_.offload_optimizer.enabled; }
  bool offload_param() const { return options_.offload_param.enabled; }
  void wait_for_comm();  // compute waits for everything enqueued on the comm stream
  // Executes one operation of the schedule.
  void run(const UnitOp& op);

  // ---- strategies (engine_strategies.cc), chosen once in the constructor ----
  // Throws unless the engine was given an offload factory where the options ask for offload.
  void check_offload_factory(const OffloadFactory& offload) const;
  // Builds the offload when options ask for one (`offload` the composition's factory).
  void build_offload(const OffloadFactory& offload);
  // Picks every unit's gather, publication, reduction and sink, and the step's strategy.
  void choose_strategies();

  // ---- unit state (unit_state.cc) ----
  void allocate_state();
  // Throws unless `arrays` has one host array per state array (master + each state tensor).
  void check_state_arrays(const StateArrays& arrays, const char* call) const;
  // Host memory (offload) or device memory of state array `a` of unit u (StateArrays order).
  DevicePtr<std::byte> device_state(int u, std::size_t a) const;
  // The optimizer's name in trace spans: "adam", "lion".
  std::string optimizer_trace_name() const;
  // The state arrays (StateArrays order) unit u holds: all of them, or a frozen unit's master
  // weights alone (Unit::frozen: no optimizer state).
  std::size_t held_state_arrays(int u) const;
  // Zeros as large as the largest frozen unit's slice, for host_state()'s view of the optimizer
  // state those units do not hold (mapped on first use, backed by no memory).
  const float* frozen_state_zeros();
  // initialize() and load_state(): host values for every unit's state, then the params.
  // master_only: `fill` writes the master weights alone (the optimizer state starts at zero),
  // so a device-resident unit's state tensors are zeroed on the device instead of copied up.
  void assign_state(const StateFiller& fill, bool master_only = false);
  // The one gate before the optimizer writes the state: the compute stream waits for a
  // pending device-state copy (the offloaded copy runs in the CPU optimizer's queue).
  void order_update_after_state_copy();
  // Where the rank's compute-dtype slice of unit u lives on the device (the stage-3 slice, or
  // its place in the full parameters).
  DevicePtr<std::byte> owned_params_of(int u);
  DevicePtr<std::byte> full_params_of(int u);

  // ---- parameters (param_gather.cc) ----
  // Stage 3: makes unit u's full parameters available (comm stream) / the compute stream waits
  // for them / frees them after the kernels that read them.
  void issue_gather(int u);
  // Allocates unit u's full parameters; the comm stream waits for the compute stream.
  void allocate_gathered(int u);
  void await_gather(int u);
  void release_gather(int u);
  // hpZ: keeps this rank's 1/S of unit u's just-gathered parameters / gathers the unit from
  // the secondary shards over the S-rank group / frees the secondary shard.
  void keep_secondary(int u);
  void issue_secondary_gather(int u);
  void free_secondary(int u);
  // Stages 1-2 (and stage 3's persistent unit): all-gathers unit u's updated slice into the
  // full parameters after a step (once `ready`, if given, says the slice is on the device).
  void publish_updated(int u, const Event* ready);
  // After a step: publish_updated() for every published unit, in the next forward's order.
  void publish_all_updated();

  // ---- gradients (gradient_reduction.cc) ----
  // The per-micro-batch gradient bucket of unit u (allocated and zeroed): stages 2-3, and a
  // frozen unit's at stages 0-1.
  void open_grad_bucket(int u);
  // Waits for the bucket's reduction on the compute stream and frees it.
  void free_grad_bucket(int u);
  // Issues the reduction of unit u's gradient (comm stream); `final`: the step's last one.
  void issue_reduce(int u, bool final);
  void reduce_bucket(int u, bool final);  // stages 2-3
  void reduce_full_gradients(int u);      // stages 0-1
  // The compute stream waits for unit u's reduction.
  void await_reduce(int u);
  DevicePtr<std::byte> owned_grad_of(int u);  // the rank's grad slice (accum dtype)
  DevicePtr<std::byte> full_grads_of(int u);  // stages 0-1: a trained unit's full gradients
  // Without offload, the squared norm of the whole gradient, summed over ranks, into norm_ with
  // no host read; returns the stream it is ready on.
  Stream& enqueue_grad_norm_squared();
  // The owned slices whose optimizer state is on the device (optimizer_.step's input).
  std::map<std::int64_t, std::vector<OptimizerDeviceSlice>> device_optimizer_slices();
  // Steps the optimizer (the CPU's units first with offload, then the device's) and publishes
  // the updated parameters; `decision` (device path) says on the device whether it applies.
  void update_parameters(double lr, std::int64_t step, double grad_scale,
                         DevicePtr<const StepDecision> decision);
  // Counts a decided step and completes its result.
  void count_decided_step(StepResult& result, float norm_squared, const StepDecisionInputs& in);
  void zero_grads();

  Device& device_;
  Stream& compute_;
  std::vector<ShardGroup> groups_;  // checked (engine_groups.cc); [0] the dense units'
  Stream& comm_;                    // every group's stream
  std::vector<ParamSpec> params_;
  int num_modules_;
  EngineOptions options_;
  DeviceOptimizer& optimizer_;
  PartitionPlan plan_;
  UnitSchedule schedule_;
  LossScaler scaler_;
  std::vector<int> unit_rank_;  // per unit: the slice this rank owns (0 at stage 0)
  std::int64_t optimizer_steps_ = 0;
  // Per parameter: the optimizer steps of the run it did not take (EngineCounters'
  // parameter_steps = optimizer_steps_ minus these); Adam steps it as optimizer step t - this.
  std::vector<std::int64_t> steps_not_taken_;
  std::int64_t skipped_steps_ = 0;

  std::vector<std::unique_ptr<UnitState>> units_;
  Buffer full_params_;  // stages 0-2: every unit's full compute-dtype parameters
  // Stages 0-1: every trained unit's full gradients (accum dtype), unit after unit
  // (full_grad_offset_; a frozen unit has none: a model that may write its gradient writes it
  // to a bucket for its modules' backward, ScheduleOptions::frozen_buckets).
  Buffer full_grads_;
  std::vector<std::int64_t> full_grad_offset_;  // per unit, elements; -1 for a frozen unit
  Buffer comm_scratch_;  // conversions to/from the communication dtype (comm stream)
  // Parameter offload: the unit whose reduced slice the copy stream reads from comm_scratch_
  // records this event once it has (its `reduced`); the next conversion into the scratch waits.
  Event* scratch_reader_ = nullptr;
  Buffer quantized_out_;  // qgZ: one reduced slice (communication dtype)
  Buffer norm_;       // a float per group: the squared gradient norm ([0] the total once summed)
  Buffer decision_;   // the StepDecision enqueue_step() takes on the device
  Buffer norm_host_;  // pinned: the norm copied down for settle_step()
  std::unique_ptr<Event> decision_ready_;  // recorded after that copy
  bool decision_pending_ = false;          // the last step's decision not yet read
  StepDecisionInputs pending_inputs_;
  StepResult last_step_;
  std::unique_ptr<Event> comm_done_;
  std::unique_ptr<Event> compute_done_;
  TraceRecorder* trace_ = nullptr;  // timeline trace; null: off

  // copy_state_out_async(): its stream (device-resident state; created on first use), the event
  // it records after the copies, and the event that orders it after the last update; with
  // offload, the copy's completion in the CPU optimizer's queue.
  std::unique_ptr<Stream> state_copy_stream_;
  std::unique_ptr<Event> state_copied_;
  std::unique_ptr<Event> state_updated_;
  std::shared_future<void> host_state_copied_;

  ZeroHostPages frozen_state_zeros_;  // frozen_state_zeros()'s mapping

  std::unique_ptr<OptimizerOffload> offload_;  // null without optimizer offload
  std::vector<UnitPlacement> placement_;       // per unit: unit_placements(options, plan)

  // The strategies (engine_strategies.cc); each unit's UnitState points at its own.
  std::vector<std::unique_ptr<GatherStrategy>> gathers_;
  std::vector<std::unique_ptr<GradientCollective>> collectives_;
  std::vector<std::unique_ptr<GradientSink>> sinks_;
  std::unique_ptr<StepStrategy> step_;
  // The units whose full parameters are published after a step, in the next forward's order
  // (stages 1-2: all; stage 3: the persistent ones; stage 0: none).
  std::vector<int> published_units_;
  // Whether every trained unit's state is on the device (frozen units are never published after
  // a step): the publication then always follows the compute stream (the device's update, or
  // nothing newer than the last backward).
  bool all_units_on_device_ = true;
};

}  // namespace zrt
