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

namespace zrt::detail {

// Enqueues cpu->step(host slices, args...) on `stream`; `args` are the step's scalars as that
// optimizer takes them (CpuAdam: step, lr, grad_scale; CpuLion: lr, grad_scale).
template <typename HostSlice, typename Cpu, typename DeviceSlice, typename... Args>
void enqueue_cpu_step(const std::shared_ptr<const Cpu>& cpu, const std::vector<DeviceSlice>& slices,
                      Stream& stream, Args... args) {
  std::vector<HostSlice> host(slices.size());
  for (std::size_t k = 0; k < slices.size(); ++k) {
    host[k] = host_slice<HostSlice>(slices[k]);
    validate_slice(host[k], k);
  }
  stream.host_callback([cpu, host = std::move(host), args...] { cpu->step(host, args...); });
}

}  // namespace zrt::detail
