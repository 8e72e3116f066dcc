// ZeroEngine's per-unit buffers and small helpers, shared by the engine's files. Private to the
// engine. With optimizer offload the fp32 state lives in the offload (OptimizerOffload) instead.
#pragma once

#include <memory>
#include <vector>

#include "runtime/engine/zero_engine.h"

namespace zrt {

struct ZeroEngine::UnitState {
  Buffer master;              // fp32 [shard] (device; empty with offload)
  std::vector<Buffer> state;  // fp32 [shard] each: the optimizer's named state tensors
  Buffer param_slice;         // stage 3: compute dtype [shard] (empty with parameter offload)
  Buffer resident;            // stage 3 persistent unit: compute dtype [numel]
  Buffer gathered;            // stage 3: full parameters while in use
  Buffer secondary;           // hpZ: compute dtype [numel / S], forward gather to last backward
  Buffer grad_slice;          // stages 2-3: accum dtype [shard] (empty with parameter offload)
  // During a micro-batch's backward, [numel] in the dtype the model writes gradients in: stages
  // 2-3 (compute dtype), and a frozen unit's at stages 0-1 (accumulation dtype).
  Buffer grad_bucket;
  std::unique_ptr<Event> gathered_ready;  // comm stream, after the gather (or the publication)
  std::unique_ptr<Event> reduced;         // after the bucket's reduction (and its copy out)

  // The unit's paths, chosen once (engine_strategies.cc); owned by the engine.
  GatherStrategy* gather = nullptr;            // stage 3: its gather (null: never gathered)
  GatherStrategy* secondary_gather = nullptr;  // hpZ: from the secondary shards
  GatherStrategy* publish = nullptr;           // after a step (null: not published)
  GradientCollective* reduce = nullptr;        // its gradient's reduction (null: frozen)
  GradientSink* sink = nullptr;                // where its reduced slice goes (null: frozen)
  // Recorded once the CPU optimizer's update of the unit is on the device (null: stepped on
  // the device, ordered by the compute stream).
  const Event* params_ready = nullptr;
};

// Element offset -> byte address in a buffer of `type` elements.
inline DevicePtr<std::byte> at(const Buffer& b, std::int64_t elements, DType type) {
  return b.device<std::byte>() + elements * static_cast<std::int64_t>(dtype_size(type));
}
inline std::int64_t bytes_of(std::int64_t elements, DType type) {
  return elements * static_cast<std::int64_t>(dtype_size(type));
}

}  // namespace zrt
