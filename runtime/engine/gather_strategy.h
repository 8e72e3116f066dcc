// How a unit's full compute-dtype parameters are assembled on the device from the ranks'
// slices: the collective behind stage 3's gathers, hpZ's gathers from the secondary shards and
// the publication of updated slices at stages 1-2. The engine picks one per unit when it is
// built (ZeroEngine::choose_strategies, engine_strategies.cc); the step only calls it, so no
// gather asks the stage, the offload or ZeRO++'s switches again.
//
// The caller orders the comm stream after whatever wrote the slice and the buffer (the
// allocation on the compute stream, an offloaded update's copy) and records the unit's
// gathered_ready event afterwards; a strategy enqueues only its collective (and, for host
// slices, the copy up), with its trace span.
//
// Thread-safety: as the engine (one thread).
#pragma once

#include <cstdint>
#include <memory>

#include "runtime/comm/process_group.h"
#include "runtime/comm/quantized_collectives.h"
#include "runtime/device/device.h"
#include "runtime/engine/optimizer_offload.h"
#include "runtime/trace/trace_recorder.h"

namespace zrt {

// One gather of one unit: `slice` (shard elements, this rank's piece; where the strategy has
// no device slice of its own it is ignored) into `full` (shard x group size elements), this
// rank's piece at `full` + rank x shard.
struct UnitGather {
  int unit = 0;
  DevicePtr<std::byte> slice;
  DevicePtr<std::byte> full;
  std::int64_t shard = 0;
  int rank = 0;
};

class GatherStrategy {
 public:
  virtual ~GatherStrategy() = default;
  // Enqueues the gather on `comm` (the group's stream), traced into `trace` when set.
  virtual void gather(const UnitGather& g, Stream& comm, TraceRecorder* trace) = 0;
};

// The plain all-gather over `group` (stage 3 without ZeRO++, and every publication after a
// step, which gathers in place from the rank's piece of `full`).
std::unique_ptr<GatherStrategy> make_all_gather(ProcessGroup& group, DType type);
// qwZ: int8 codes and block scales on the wire; every rank computes with the same dequantized
// values, this one included.
std::unique_ptr<GatherStrategy> make_quantized_gather(QuantizedCollectives& quantized, DType type);
// Parameter offload: the slice lives in the offload's host memory (host_params(u)); it comes up
// into its place in `full` once the CPU optimizer wrote it, then the gather runs in place.
std::unique_ptr<GatherStrategy> make_host_slice_gather(Device& device, OptimizerOffload& offload,
                                                       ProcessGroup& group, DType type);
// hpZ: the unit from the secondary shards (`slice` is the rank's secondary shard, `shard` its
// size) over the S-rank secondary group, inside the node.
std::unique_ptr<GatherStrategy> make_secondary_gather(ProcessGroup& secondary, DType type);

}  // namespace zrt
