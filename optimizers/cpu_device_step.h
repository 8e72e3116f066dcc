// The CPU backend's stream-ordered optimizer step, shared by DeviceAdam and DeviceLion: device
// memory is host memory, so the device slices become host slices over the same memory
// (validated now, so a malformed slice throws before anything is enqueued), and the CPU
// optimizer's step runs as a host callback on the stream: after the reduce-scatter that produced
// the gradients, before later work such as the all-gather of the updated parameters.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "optimizers/optimizer_slices.h"
#include "runtime/device/device.h"
#include "runtime/engine/step_decision.h"

namespace zrt::detail {

// Enqueues cpu->step(host slices, args..., grad_scale) on `stream`; `args` are the step's other
// scalars as that optimizer takes them (CpuAdam: step, lr; CpuLion: lr). With a `decision`
// (DeviceOptimizer::step) the callback reads it when it runs: no update when it does not apply,
// else its grad_scale instead of `grad_scale`.
template <typename HostSlice, typename Cpu, typename DeviceSlice, typename... Args>
void enqueue_cpu_step(const std::shared_ptr<const Cpu>& cpu, const std::vector<DeviceSlice>& slices,
                      Stream& stream, DevicePtr<const StepDecision> decision, double grad_scale,
                      Args... args) {
  std::vector<HostSlice> host(slices.size());
  for (std::size_t k = 0; k < slices.size(); ++k) {
    host[k] = host_slice<HostSlice>(slices[k]);
    validate_slice(host[k], k);
  }
  const StepDecision* d = raw_pointer(decision);
  stream.host_callback([cpu, host = std::move(host), d, grad_scale, args...] {
    if (d == nullptr) return cpu->step(host, args..., grad_scale);
    if (d->apply == 0) return;
    cpu->step(host, args..., static_cast<double>(d->grad_scale));
  });
}

}  // namespace zrt::detail
