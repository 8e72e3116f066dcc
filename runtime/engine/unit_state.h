// ZeroEngine's per-unit state and small helpers, shared by zero_engine.cc and
// zero_engine_offload.cc. Private to the engine.
#pragma once

#include <future>
#include <memory>
#include <vector>

#include "runtime/engine/zero_engine.h"

namespace zrt {

struct ZeroEngine::UnitState {
  Buffer master;              // fp32 [shard]
  std::vector<Buffer> state;  // fp32 [shard] each: the optimizer's named state tensors
  Buffer param_slice;         // stage 3: compute dtype [shard]
  Buffer resident;            // stage 3 persistent unit: compute dtype [numel]
  Buffer gathered;            // stage 3: full parameters while in use
  bool gather_issued = false;
  Buffer grad_slice;   // stages 2-3: accum dtype [shard]
  Buffer grad_bucket;  // stages 2-3: compute dtype [numel], during a micro-batch's backward
  std::unique_ptr<Event> gathered_ready;  // comm stream, after the gather
  std::unique_ptr<Event> reduced;         // after the bucket's reduction (and its copy out)
  // Offload.
  Buffer host_grad;    // host, accum dtype [shard]: the gradient the CPU optimizer reads
  Buffer host_params;  // parameter offload: host, compute dtype [shard]
  std::unique_ptr<Event> comm_point;    // comm stream, after the unit's reduction
  std::unique_ptr<Event> d2h_done;      // copy stream: host_grad holds the gradient
  std::unique_ptr<Event> params_ready;  // copy stream: the updated slice reached the device
  std::shared_future<void> cpu_done;    // the CPU optimizer is done with this unit
  // Sum of squares of host_grad, taken on the copy stream as the final gradient arrives (read
  // after d2h_done has completed).
  double host_grad_sum_squares = 0.0;
};

// Element offset -> byte address in a buffer of `type` elements.
inline DevicePtr<std::byte> at(const Buffer& b, std::int64_t elements, DType type) {
  return b.device<std::byte>() + elements * static_cast<std::int64_t>(dtype_size(type));
}
inline std::int64_t bytes_of(std::int64_t elements, DType type) {
  return elements * static_cast<std::int64_t>(dtype_size(type));
}

}  // namespace zrt
