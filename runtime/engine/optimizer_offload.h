// The seam between the engine and optimizer offload (DeepSpeed's offload_optimizer /
// offload_param with device "cpu"): with it the fp32 master weights and the optimizer state
// live in host memory and a CPU implementation of the optimizer steps them, overlapped with the
// copies that bring gradients down and parameters up. The engine calls this interface at the
// points of its schedule; the implementation (offload/, above the runtime) owns the host state,
// the copy pipeline, the CPU optimizer's thread and the staging ring, and uses only the Device
// seam. The composition (zrt-train, the library's Trainer) hands the engine a factory.
//
// Thread-safety: called from the engine's thread only; the implementation runs its own work on
// its streams.
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <vector>

#include "runtime/device/device.h"
#include "runtime/engine/optimizer_interface.h"
#include "runtime/engine/partition.h"
#include "runtime/engine/unit_placement.h"
#include "runtime/model_interface.h"
#include "runtime/trace/trace_recorder.h"

namespace zrt {

// What an offload implementation is built from: the engine's device, streams, layout and
// optimizer. All outlive the offload.
struct OffloadContext {
  Device& device;
  Stream& comm;  // the process group's stream, where reductions finish
  const PartitionPlan& plan;
  const std::vector<ParamSpec>& params;
  const EngineOptions& options;
  const DeviceOptimizer& optimizer;  // its make_host_optimizer() steps the host state
  int rank;                          // the slice this rank owns of group 0's units (logs)
  // Per unit: the slice this rank owns of it (its rank in the unit's shard group).
  const std::vector<int>& unit_ranks;
  // Per unit, where its buffers live (unit_placement.h): its state in host memory
  // (stepped_on_host()) or on the device, stepped there by the engine (partial offload); its
  // parameter slice in host memory with parameter offload.
  const std::vector<UnitPlacement>& placement;
};

class OptimizerOffload {
 public:
  virtual ~OptimizerOffload() = default;

  // ---- placement: the state in host memory, plan().unit(u).shard floats per array ----
  // State array `a` of offloaded unit u: 0 the fp32 master weights, then the optimizer's named
  // states.
  virtual float* state_array(int u, int a) = 0;
  // Parameter offload: unit u's compute-dtype parameter slice in host memory; null where the
  // slice lives on the device (no parameter offload, or stage 3's persistent unit).
  virtual void* host_params(int u) = 0;

  // ---- backward ----
  // Unit u's reduced gradient slice is at `reduced` (in `type`) once the comm stream gets here.
  // Without parameter offload it is the step's final gradient (`final`) and goes down once: in
  // grad_accum_dtype from the device's accumulated slice, or, at one micro-batch per step
  // (offload_takes_reduced_slices), in the compute dtype from the reduction's bucket; with
  // parameter offload every micro-batch's slice goes down and is accumulated on the host. Where
  // the slice is in a bucket, `bucket_read` is recorded once it has been read (the bucket may go).
  // Called for every unit: of a unit whose state stays on the device (partial offload) only
  // the sum of squares is taken, so the norm is summed over all units in one order.
  virtual void gradient_reduced(int u, DevicePtr<std::byte> reduced, DType type, bool final,
                                Event* bucket_read) = 0;

  // ---- the step ----
  // This rank's squared gradient norm over the units of shard group `group` (Unit::group): each
  // unit's sum of squares (taken as its final gradient arrived) added in fp32 in unit order, as
  // the device path adds them. Waits for the sums only: the gradient slices may still be on
  // their way down (gradients_read()).
  virtual float local_norm_squared(int group) = 0;
  // Recorded by local_norm_squared() after every copy that reads a reduced gradient slice on
  // the device: the engine's streams wait for it before anything may write those slices again.
  virtual const Event& gradients_read() const = 0;
  // Enqueues the update of every offloaded unit (1-based `step`, learning rate `lr`, gradients
  // scaled by `factor`) on the CPU optimizer's thread, in the order the next forward needs them,
  // and the copy of each updated compute-dtype slice to `destination(u)` (units with host
  // parameters are written in place instead). Parameter p steps as step
  // `step - steps_not_taken[p]` (its own count: ZeroEngine::counters' parameter_steps).
  // Every write of parameters the device may read (the copies up, the CPU's writes of host
  // parameter slices) follows everything enqueued on the comm stream before the call, where the
  // engine first joins its compute stream: a forward enqueued before the step reads the old
  // values. Returns at once.
  virtual void update(std::int64_t step, const std::vector<std::int64_t>& steps_not_taken,
                      double lr, double factor,
                      const std::function<DevicePtr<std::byte>(int u)>& destination) = 0;
  // Recorded on the copy stream once offloaded unit u's updated slice reached the device (never
  // recorded before the first update, nor for a unit stepped on the device: waiting on it is
  // then no wait).
  virtual const Event& params_ready(int u) const = 0;
  // Parameter offload: `stream` waits until the CPU optimizer has written unit u's host slice.
  virtual void wait_for_update(int u, Stream& stream) = 0;
  // A skipped step: the gradients the CPU optimizer would have consumed start again from zero.
  virtual void skip_update() = 0;

  // ---- checkpoints and introspection ----
  // Runs `work` on the CPU optimizer's thread (the one that writes the host state) after the
  // updates enqueued so far and before any later one: a checkpoint's copy of the state. The
  // future is ready when it ran, or holds its exception.
  virtual std::shared_future<void> run_between_updates(std::function<void()> work) = 0;
  virtual Stream& copy_stream() = 0;  // device <-> host copies
  struct Status {
    bool cpu_updated = false;  // the CPU optimizer finished this unit's last update
    bool on_device = false;    // ...and the updated slice reached the device
  };
  virtual Status status(int u) const = 0;
  virtual void set_trace(TraceRecorder* recorder) = 0;
  // Blocks until the CPU optimizer and the copies are done; rethrows their errors.
  virtual void synchronize() = 0;
};

using OffloadFactory = std::function<std::unique_ptr<OptimizerOffload>(const OffloadContext&)>;

}  // namespace zrt
