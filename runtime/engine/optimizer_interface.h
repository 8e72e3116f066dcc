// What the engine, the checkpoints and the planners ask an optimizer instead of assuming Adam:
// the fp32 state tensors it keeps per parameter, by name, and so the bytes of optimizer state
// per parameter; and the two ways the engine steps it (device-resident state, or host-resident
// state with optimizer offload). The optimizers themselves live above the runtime, in
// optimizers/ (optimizers/optimizer.h builds them from the config); the engine is handed one.
//
// Every optimizer keeps fp32 master weights of the owned slices plus its named state tensors,
// each one fp32 per parameter and zero before the first step:
//   Adam, AdamW: "exp_avg", "exp_avg_sq"   12 bytes per parameter (master + 2 moments)
//   Lion:        "exp_avg"                  8 bytes per parameter (master + momentum)
// The names are the checkpoint dataset names (runtime/checkpoint), which keeps the files
// written before this seam loadable.
//
// The engine holds an optimizer as a DeviceOptimizer: it allocates one fp32 buffer per named
// state for each owned slice, and hands the optimizer slices whose state[i] is the state called
// spec().state_names[i]. With optimizer offload it steps the same slices in host memory through
// make_host_optimizer().
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/common/dtype.h"
#include "runtime/device/device.h"
#include "runtime/device/device_ptr.h"
#include "runtime/engine/step_decision.h"

namespace zrt {

struct OptimizerSpec {
  // The state family: optimizers with the same family have interchangeable state (Adam and
  // AdamW: same moments, only the decay differs), so a checkpoint of one resumes the other.
  std::string family = "Adam";
  std::vector<std::string> state_names = {"exp_avg", "exp_avg_sq"};
  std::string state_description = "Adam moments";  // for reports: "Lion momentum"

  int num_states() const { return static_cast<int>(state_names.size()); }
  // fp32 master weights plus every state tensor.
  std::int64_t state_bytes_per_parameter() const { return 4 * (1 + num_states()); }
  // Index of the state called `name`, or -1.
  int state_index(const std::string& name) const {
    for (int i = 0; i < num_states(); ++i) {
      if (state_names[static_cast<std::size_t>(i)] == name) return i;
    }
    return -1;
  }
};

// The most state tensors any optimizer keeps (Adam's two).
constexpr int kMaxOptimizerStates = 2;

// One contiguous run of owned elements in host memory (the CPU backend's device memory, or
// offloaded state): as AdamSlice, with the state tensors by index into spec().state_names.
struct OptimizerSlice {
  float* param = nullptr;
  const void* grad = nullptr;
  std::array<float*, kMaxOptimizerStates> state{};  // state[i]: spec().state_names[i]
  void* param_out = nullptr;
  std::int64_t numel = 0;
  DType grad_dtype = DType::kFloat32;
  DType out_dtype = DType::kBFloat16;
  bool weight_decay = true;
};

// The same in device memory.
struct OptimizerDeviceSlice {
  DevicePtr<float> param;
  DevicePtr<const std::byte> grad;
  std::array<DevicePtr<float>, kMaxOptimizerStates> state{};
  DevicePtr<std::byte> param_out;
  std::int64_t numel = 0;
  DType grad_dtype = DType::kFloat32;
  DType out_dtype = DType::kBFloat16;
  bool weight_decay = true;
};

// What a prepared host step writes: everything (the fp32 parameters, the states and the
// compute-dtype copy in param_out), or only the compute-dtype copy, leaving the parameters and
// states as they were, so that running the same step again with kAll (on slices without
// param_out) writes the state the single kAll step would have: optimizer offload's split step,
// which sends the next forward's parameters up first and writes the state behind it.
enum class StepWrites { kAll, kComputeCopyOnly };

// An optimizer stepping host-memory slices on the calling thread (optimizer offload).
class HostOptimizer {
 public:
  virtual ~HostOptimizer() = default;
  // Step `step` (1-based; Adam's bias correction, ignored by Lion) with learning rate `lr`, in
  // place; gradients multiplied by `grad_scale`. Blocks until done; throws InvalidArgument for a
  // malformed slice or bad scalars before touching memory.
  virtual void step(const std::vector<OptimizerSlice>& slices, std::int64_t step, double lr,
                    double grad_scale) const = 0;
  virtual const OptimizerSpec& spec() const = 0;

  // The same arithmetic for a caller that runs the threads itself (optimizer offload steps many
  // units' slices as one stream of chunks, offload/cpu_step_pipeline.h): throws InvalidArgument
  // for bad scalars, else returns a function that steps elements [begin, end) of one slice on
  // the calling thread. Any split of the elements gives the bits step() gives. With
  // StepWrites::kComputeCopyOnly the function writes only param_out (see StepWrites).
  using RangeStep =
      std::function<void(const OptimizerSlice& slice, std::int64_t begin, std::int64_t end)>;
  virtual RangeStep prepare_step(std::int64_t step, double lr, double grad_scale,
                                 StepWrites writes) const = 0;
  RangeStep prepare_step(std::int64_t step, double lr, double grad_scale) const {
    return prepare_step(step, lr, grad_scale, StepWrites::kAll);
  }
  // Throws InvalidArgument naming slice `index` if it is malformed (what step() checks first).
  virtual void validate(const OptimizerSlice& slice, std::size_t index) const = 0;
  // The threads step() splits its work over.
  virtual int threads() const = 0;
};

// The engine's optimizer when the state lives in device memory: step() is stream-ordered (a
// host callback on the CPU backend, a kernel launch on CUDA; see DeviceAdam).
class DeviceOptimizer {
 public:
  virtual ~DeviceOptimizer() = default;
  virtual const OptimizerSpec& spec() const = 0;
  // Enqueues step `step` (1-based) with learning rate `lr` over `slices` on `stream` (see
  // HostOptimizer::step); the slices' memory must stay valid until the stream reaches it.
  // With a `decision` (device memory, written earlier on the stream or before a wait on it),
  // the step reads it when it runs: its grad_scale replaces `grad_scale`, and when it does not
  // apply the step writes nothing (no parameter, state or output changes). So the host enqueues
  // the update without waiting for the gradient norm (ZeroEngine::enqueue_step).
  virtual void step(const std::vector<OptimizerDeviceSlice>& slices, std::int64_t step, double lr,
                    Stream& stream, double grad_scale = 1.0,
                    DevicePtr<const StepDecision> decision = {}) = 0;
  // The CPU implementation of the same optimizer and hyper-parameters, for optimizer offload.
  virtual std::unique_ptr<HostOptimizer> make_host_optimizer() const = 0;
};

}  // namespace zrt
