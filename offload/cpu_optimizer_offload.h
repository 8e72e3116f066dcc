// Optimizer (and parameter) offload to host memory with a CPU optimizer: the implementation of
// the engine's OptimizerOffload seam (runtime/engine/optimizer_offload.h) for any optimizer with
// a CPU implementation (DeviceOptimizer::make_host_optimizer: Adam, AdamW, Lion).
//
// The pipeline of one step (docs/architecture.md; clipping and the overflow check need every
// gradient first):
//   backward:  each unit's final gradient slice goes device->host on the copy stream as soon
//              as its reduction is done, while the backward of earlier units still runs, in
//              pieces of EngineOptions::offload_transfer_piece elements;
//   decision:  each unit's sum of squares is taken as its final gradient arrives: on the device,
//              by the copy stream before the slice goes down (the device path's own kernel, so
//              on a GPU no host thread reads the whole gradient; the sum goes down first, so the
//              decision does not wait for the slice), or, with parameter offload where the final
//              gradient exists only on the host, by the copy stream on the host; the engine
//              waits for the last one and adds them in unit order (the device path's order, so
//              the clipping decision is the same bit for bit);
//   update:    the CPU-optimizer thread steps the units in the order the next forward needs
//              them, each piece once it is on the host, writing compute-dtype parameters into a
//              ring of staging buffers; the copy stream carries unit u up while the CPU steps
//              unit u+1. The next forward waits only for its own units, so it runs on the units
//              already updated while the CPU steps the rest. With parameter offload the CPU
//              writes the host parameter slices directly and the engine's gather copies them up.
//
// Streams (one per role): the copy stream (device <-> host, made by the Device) and the CPU
// optimizer's host thread (Device::create_host_stream: host work on host memory, whatever the
// device).
#pragma once

#include <future>
#include <memory>
#include <string>
#include <vector>

#include "runtime/device/cpu_stream.h"
#include "runtime/engine/optimizer_offload.h"
#include "runtime/engine/zero_engine.h"

namespace zrt {

class CpuOptimizerOffload final : public OptimizerOffload {
 public:
  explicit CpuOptimizerOffload(const OffloadContext& context);
  ~CpuOptimizerOffload() override;

  float* state_array(int u, int a) override;
  void* host_params(int u) override;
  void gradient_reduced(int u, DevicePtr<std::byte> reduced, DType type, bool final,
                        Event* bucket_read) override;
  float local_norm_squared(int group) override;
  const Event& gradients_read() const override { return *gradients_read_; }
  void update(std::int64_t step, const std::vector<std::int64_t>& steps_not_taken, double lr,
              double factor,
              const std::function<DevicePtr<std::byte>(int u)>& destination) override;
  const Event& params_ready(int u) const override;
  void wait_for_update(int u, Stream& stream) override;
  void skip_update() override;
  std::shared_future<void> run_between_updates(std::function<void()> work) override;
  Stream& copy_stream() override { return *copy_; }
  Status status(int u) const override;
  void set_trace(TraceRecorder* recorder) override { trace_ = recorder; }
  void synchronize() override;

 private:
  // One unit's host side.
  struct HostUnit {
    Buffer master;                      // fp32 [shard]
    std::vector<Buffer> state;          // fp32 [shard] each: the optimizer's named states
    Buffer grad;                        // grad_type_ [shard]: the gradient the CPU optimizer reads
    Buffer params;                      // parameter offload: compute dtype [shard]
    std::unique_ptr<Event> comm_point;  // comm stream, after the unit's reduction
    std::unique_ptr<Event> norm_ready;  // copy stream: the unit's sum of squares is on the host
    std::unique_ptr<Event> d2h_done;    // copy stream: `grad` holds the final gradient
    // Without parameter offload: piece c of `grad` is on the host, two sets used by alternate
    // steps. The CPU-optimizer thread waits on a step's set while the engine may already be
    // enqueueing the next step's copies; those record the other set, and the set after waits
    // for this step's CPU work (gradient_reduced's `consumed`), so no wait sees a later record.
    std::vector<std::unique_ptr<Event>> pieces[2];
    std::unique_ptr<Event> params_ready;  // copy stream: the updated slice reached the device
    std::shared_future<void> cpu_done;    // the CPU optimizer is done with this unit
    // Raised to `released_value` once the CPU optimizer is done with the unit (or failed): the
    // copy stream's wait before its next gradient comes down over the slice the CPU still reads
    // (0: never updated).
    std::unique_ptr<HostSignal> released;
    // Raised to `released_value` once the unit's updated compute-dtype parameters are written
    // (with the split step before its state is; else with `released`): the copy stream's wait
    // before they go up, and with parameter offload the forward's.
    std::unique_ptr<HostSignal> params_written;
    std::uint32_t released_value = 0;
    double grad_sum_squares = 0.0;  // parameter offload: of `grad`, on the host
  };
  MemorySpace host_space(bool for_params) const;
  // Rethrows the error of a CPU step that failed (its units' `cpu_done`), if one did.
  void rethrow_cpu_step_error() const;
  // Whether the CPU optimizer steps unit u: its state is here and it is not frozen.
  bool steps_on_host(int u) const;

  Device& device_;
  Stream& comm_;
  const PartitionPlan& plan_;
  const std::vector<ParamSpec>& params_;
  const EngineOptions& options_;
  int rank_;
  std::vector<int> unit_ranks_;  // OffloadContext::unit_ranks
  bool offload_param_;
  // Per unit, where its buffers live (unit_placement.h): its state here when stepped_on_host()
  // (else the device steps it), its parameter slice here with parameter offload.
  std::vector<UnitPlacement> placement_;
  std::string trace_name_;  // the optimizer in trace spans: "adam", "lion"
  std::unique_ptr<HostOptimizer> host_optimizer_;
  // One micro-batch per step (offload_takes_reduced_slices): each reduced slice comes down as it
  // is, into `grad`, in the compute dtype; else `grad` is in grad_accum_dtype.
  bool reduced_as_is_;
  DType grad_type_;
  std::unique_ptr<Stream> copy_;              // device <-> host copies
  std::unique_ptr<CpuStream> cpu_optimizer_;  // the host thread that runs the CPU optimizer
  std::vector<HostUnit> units_;
  std::vector<Buffer> staging_;  // host, compute dtype: updated parameters on their way up
  Buffer host_reduced_;  // parameter offload with accumulation: one reduced slice on its way down
  // Without parameter offload: each unit's sum of squares of its final gradient, taken on the
  // device (fp32 [units]) and copied down beside the gradient.
  Buffer unit_norms_device_;
  Buffer unit_norms_host_;
  std::vector<int> forward_order_;         // units in the order the next forward needs them
  std::int64_t piece_;                     // elements of a gradient piece (offload_transfer_piece)
  int piece_set_ = 0;                      // the set of `pieces` this step's copies record
  std::unique_ptr<Event> gradients_read_;  // copy stream: after the step's copies down
  std::uint32_t updates_ = 0;              // update() calls: the value units' signals rise to
  bool split_step_ = false;                // EngineOptions::offload_split_step, resolved
  // Comm stream, at update(): every read of the parameters enqueued before the step is done (an
  // eval forward between the last backward and step()); two, used by alternate steps.
  std::unique_ptr<Event> reads_done_[2];
  TraceRecorder* trace_ = nullptr;
};

// The factory the composition hands ZeroEngine (OffloadFactory).
std::unique_ptr<OptimizerOffload> make_cpu_optimizer_offload(const OffloadContext& context);

}  // namespace zrt
