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
// Thread-safety: one thread drives the engine (the thread that owns the compute stream).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include <future>

#include "runtime/comm/process_group.h"
#include "runtime/device/cpu_stream.h"
#include "runtime/engine/loss_scaler.h"
#include "runtime/engine/optimizer_interface.h"
#include "runtime/engine/partition.h"
#include "runtime/model_interface.h"
#include "runtime/trace/trace_recorder.h"

namespace zrt {

// DeepSpeed's offload_optimizer / offload_param with device "cpu".
struct OffloadOptions {
  bool enabled = false;
  bool pin_memory = true;  // false: pageable host memory (hosts with a low `ulimit -l`)
};

struct EngineOptions {
  int stage = 0;
  DType compute_dtype = DType::kFloat32;
  std::optional<DType> communication_dtype;  // default: compute_dtype
  DType grad_accum_dtype = DType::kFloat32;  // data_types.grad_accum_dtype
  int gradient_accumulation_steps = 1;
  double gradient_clipping = 0.0;  // 0: off
  std::int64_t reduce_bucket_size = 500000000;
  std::int64_t stage3_prefetch_bucket_size = 50000000;
  std::int64_t stage3_max_live_parameters = 1000000000;
  std::int64_t stage3_param_persistence_threshold = 100000;
  bool overlap_comm = true;  // false: the compute stream waits for each collective at once
  std::int64_t alignment = 64;
  LossScaleOptions loss_scale;  // used with fp16 compute
  // Optimizer offload (stages 1-3): fp32 master weights and optimizer state live in host memory
  // and the CPU steps them; parameter offload (stage 3, with optimizer offload): parameter
  // slices and gradient accumulation live in host memory too.
  OffloadOptions offload_optimizer;
  OffloadOptions offload_param;
  int offload_staging_buffers = 4;  // pinned buffers carrying updated parameters to the device
};

// The engine's counters at a step boundary (checkpointed with the optimizer state).
struct EngineCounters {
  std::int64_t optimizer_steps = 0;  // applied steps (Adam's bias-correction step count)
  std::int64_t skipped_steps = 0;
  LossScaleState loss_scale;
};

struct StepResult {
  bool skipped = false;              // non-finite gradients (or fp16 overflow): no update anywhere
  double grad_norm = 0.0;            // global L2 norm of the (unscaled, averaged) gradient
  double loss_scale = 1.0;           // the scale the step's gradients were computed with
  std::int64_t optimizer_steps = 0;  // successful steps so far
  std::int64_t skipped_steps = 0;
};

class ZeroEngine final : public ParamAccess {
 public:
  // `group` issues on the communication stream; `compute` is the model's stream. All must
  // outlive the engine.
  ZeroEngine(Device& device, Stream& compute, ProcessGroup& group, std::vector<ParamSpec> params,
             int num_modules, const EngineOptions& options, DeviceOptimizer& optimizer);
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
  // per array, padding included). Synchronises.
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
  EngineCounters counters() const;
  // Replaces the optimizer state: fill(u, arrays) writes this rank's slice of every unit into
  // the state_array_count() host arrays (shard floats each, all zero, to be left zero in the
  // padding); the compute-dtype
  // parameters are re-derived from the master weights and gathered where the stage keeps full
  // copies. Collective at stages 1-3; the counters (step count, loss scaler) are restored.
  using StateFiller = std::function<void(int u, const StateArrays& arrays)>;
  void load_state(const EngineCounters& counters, const StateFiller& fill);
  int state_rank() const { return rank_; }  // the slice this rank owns (0 at stage 0)

  // ParamAccess.
  void acquire(int module, Phase phase) override;
  void release(int module, Phase phase) override;
  DevicePtr<std::byte> param(int index) override;
  DevicePtr<std::byte> grad(int index) override;
  DType compute_dtype() const override { return options_.compute_dtype; }
  DType grad_dtype() const override;

  // The loss scale the model must multiply its loss gradient by (1 without fp16).
  double loss_scale() const {
    return options_.compute_dtype == DType::kFloat16 ? scaler_.scale() : 1.0;
  }
  // At the accumulation boundary (after gradient_accumulation_steps micro-batches): reduces
  // what is left, takes the global decision, clips, steps the optimizer on the owned slices and
  // makes the updated parameters available for the next forward.
  StepResult step(double lr);

  // The full fp32 master value of a parameter, gathered to every rank (collective; tests and
  // export). Synchronises.
  std::vector<float> full_parameter(int param);
  const PartitionPlan& plan() const { return plan_; }
  const std::vector<ParamSpec>& params() const { return params_; }
  const EngineOptions& options() const { return options_; }
  int micro_batches_done() const { return micro_batch_; }
  const LossScaler& loss_scaler() const { return scaler_; }

  // Offload introspection (tests, tracing): the copy stream, and where a unit's last update is.
  Stream* copy_stream() const { return copy_.get(); }
  struct OffloadStatus {
    bool cpu_updated = false;  // the CPU optimizer finished this unit's last update
    bool on_device = false;    // ...and the updated slice reached the device
  };
  OffloadStatus offload_status(int unit) const;

  // Timeline trace: from now on, the engine's work on every stream is recorded into `recorder`
  // as named spans ("forward module 2", "reduce_scatter unit 3", "d2h unit 3", "adam unit 3",
  // "h2d unit 3", "all_gather unit 3"); null stops recording (the default: then tracing costs a
  // null check). Call between micro-batches or steps. The recorder must outlive the work
  // enqueued while it was set: synchronize() before destroying or writing it.
  void set_trace(TraceRecorder* recorder) { trace_ = recorder; }
  // Blocks until all work the engine enqueued (compute, communication, copies, CPU optimizer)
  // has finished; rethrows a stream error.
  void synchronize();

 private:
  struct UnitState;
  void allocate_state();
  // Throws unless `arrays` has one host array per state array (master + each state tensor).
  void check_state_arrays(const StateArrays& arrays, const char* call) const;
  // State array `array` of a unit (StateArrays order: 0 master, then the optimizer's states).
  static const Buffer& state_buffer(const UnitState& s, std::size_t array);
  // The optimizer's name in trace spans: "adam", "lion".
  std::string optimizer_trace_name() const;
  // initialize() and load_state(): host values for every unit's state, then the params.
  void assign_state(const StateFiller& fill);
  int partition_world() const;
  DType comm_dtype() const;
  bool sharded_params() const { return options_.stage == 3; }
  bool per_micro_batch_grads() const { return options_.stage >= 2; }
  // Stage 3: makes unit u's full parameters available on the compute stream.
  void gather(int u);
  void prefetch_after(int module, Phase phase);
  void release_gathered(int u);
  // Stage 2-3: the per-micro-batch gradient buffer of unit u (allocated and zeroed on demand).
  void open_grad_bucket(int u);
  // Frees every bucket once its reduction is done (end of a micro-batch's backward).
  void close_grad_buckets();
  // Issues the reduction of unit u's gradient once its last backward use is done.
  void reduce_unit(int u);
  void wait_for_comm();  // compute waits for everything enqueued on the comm stream
  // The one gate before the optimizer writes the state: the stream that runs the update (the
  // compute stream, or the CPU optimizer with offload) waits for a pending state copy.
  void order_update_after_state_copy();
  // Offload (zero_engine_offload.cc).
  bool offload_optimizer() const { return options_.offload_optimizer.enabled; }
  bool offload_param() const { return options_.offload_param.enabled; }
  MemorySpace host_space(const OffloadOptions& o) const {
    return o.pin_memory ? MemorySpace::kPinnedHost : MemorySpace::kPageableHost;
  }
  void setup_offload();
  // After unit u's reduction on the last micro-batch (every micro-batch with parameter
  // offload): brings its gradient slice to host memory on the copy stream.
  void offload_gradient(int u, DevicePtr<std::byte> reduced, DType type, bool final);
  double offloaded_norm_squared();  // waits for the gradients to reach the host
  void update_offloaded(double lr, double factor);
  void zero_offloaded_grads();
  DevicePtr<std::byte> full_params_of(int u);
  DevicePtr<std::byte> owned_grad_of(int u);  // the rank's grad slice (accum dtype)

  Device& device_;
  Stream& compute_;
  ProcessGroup& group_;
  Stream& comm_;
  std::vector<ParamSpec> params_;
  int num_modules_;
  EngineOptions options_;
  DeviceOptimizer& optimizer_;
  PartitionPlan plan_;
  LossScaler scaler_;
  int rank_;
  int micro_batch_ = 0;  // micro-batches finished since the last step
  std::int64_t optimizer_steps_ = 0;
  std::int64_t skipped_steps_ = 0;

  std::vector<std::unique_ptr<UnitState>> units_;
  Buffer full_params_;   // stages 0-2: every unit's full compute-dtype parameters
  Buffer full_grads_;    // stages 0-1: every unit's full gradients (accum dtype)
  Buffer comm_scratch_;  // conversions to/from the communication dtype (comm stream)
  Buffer norm_;          // one float: the squared gradient norm
  std::unique_ptr<Event> comm_done_;
  std::unique_ptr<Event> compute_done_;
  std::deque<int> rotating_buckets_;  // stages 2-3: live buckets of contiguous modules
  std::deque<int> pinned_buckets_;    // stages 2-3: live shared / persistent buckets
  std::int64_t live_gathered_ = 0;    // stage 3: elements of gathered, releasable units
  TraceRecorder* trace_ = nullptr;    // timeline trace; null: off

  // copy_state_out_async(): its stream (device-resident state; created on first use), the event
  // it records after the copies, and the event that orders it after the last update.
  std::unique_ptr<Stream> state_copy_stream_;
  std::unique_ptr<Event> state_copied_;
  std::unique_ptr<Event> state_updated_;

  // Offload.
  std::unique_ptr<Stream> copy_;                   // device <-> host copies
  std::unique_ptr<CpuStream> cpu_optimizer_;       // the host thread that runs the CPU optimizer
  std::unique_ptr<HostOptimizer> host_optimizer_;  // the offloaded state's optimizer
  std::vector<Buffer> staging_;     // host, compute dtype: updated parameters on their way
  Buffer host_reduced_;             // parameter offload: one reduced slice on its way
  std::vector<int> forward_order_;  // units in the order the next forward needs them
};

}  // namespace zrt
