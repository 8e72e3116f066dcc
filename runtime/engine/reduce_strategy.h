// How a unit's gradient is reduced across ranks and where its reduced slice goes, in two
// pieces the engine picks per unit when it is built (ZeroEngine::choose_strategies,
// engine_strategies.cc), so issue_reduce() asks neither the stage nor the offload:
//   GradientCollective  the collective: stage 0's all-reduce (every rank keeps the unit),
//                       the reduce-scatter (stages 1-3; averaged again over MiCS's replicas),
//                       qgZ's quantized reduce-scatter
//   GradientSink        where a stage 2-3 bucket's reduced slice goes: accumulated into the
//                       device's gradient slice (and, at the step's last micro-batch, shown to
//                       the optimizer offload), accumulated in the offload's host memory
//                       (parameter offload), or handed to the offload as the final gradient
//                       (offload_takes_reduced_slices); at stages 0-1 the final slice in the
//                       full gradients, shown to the offload or to nobody
// The caller orders the comm stream after the compute stream, converts to and from the
// communication dtype and records the events; these enqueue only their own work, on the comm
// stream.
//
// Thread-safety: as the engine (one thread).
#pragma once

#include <cstdint>
#include <memory>

#include "runtime/comm/process_group.h"
#include "runtime/comm/quantized_collectives.h"
#include "runtime/device/device.h"
#include "runtime/engine/optimizer_offload.h"
#include "runtime/trace/trace_span.h"

namespace zrt {

// The rank's part of a reduced unit: elements [first, first + count) at `data`.
struct ReducedPart {
  DevicePtr<std::byte> data;
  std::int64_t first = 0;
  std::int64_t count = 0;
};

class GradientCollective {
 public:
  virtual ~GradientCollective() = default;
  // The trace span's name: "all_reduce", "reduce_scatter".
  virtual const char* name() const = 0;
  // Averages the unit's gradient, `shard` x ranks elements of `type` at `grads` (overwritten
  // where the collective works in place), over the unit's ranks; returns this rank's part.
  virtual ReducedPart reduce(DevicePtr<std::byte> grads, std::int64_t shard, int rank,
                             DType type) = 0;
  // False for make_no_reduction(): the caller then leaves the gradients as they are (no
  // conversion to the communication dtype and back).
  virtual bool communicates() const { return true; }
};

// Stage 0: the whole unit, averaged in place on every rank.
std::unique_ptr<GradientCollective> make_all_reduce(ProcessGroup& group);
// The rank's slice, in place, then averaged over `replicas` (MiCS, HSDP) when not null.
std::unique_ptr<GradientCollective> make_reduce_scatter(ProcessGroup& group,
                                                        ProcessGroup* replicas);
// `inner`, then this rank's reduced part multiplied by `factor` on `stream` (the comm stream,
// where `inner` leaves it): expert units' 1 / ep (ShardGroup::gradient_scale). `inner` must
// outlive it.
std::unique_ptr<GradientCollective> make_scaled(GradientCollective& inner, Device& device,
                                                Stream& stream, float factor);
// Stages 0-1 on one rank without replicas: nothing to average. `name` is the stage's
// collective, which the trace still shows (an empty span) as it always did.
std::unique_ptr<GradientCollective> make_no_reduction(const char* name);
// qgZ: quantized, summed in fp32 inside the node, then between nodes, into `out` (its input is
// the whole bucket), then averaged over `replicas` when not null.
std::unique_ptr<GradientCollective> make_quantized_reduce_scatter(QuantizedCollectives& quantized,
                                                                  ProcessGroup* replicas,
                                                                  DevicePtr<std::byte> out);

// A reduced slice handed to a sink.
struct ReducedSlice {
  int unit = 0;
  DevicePtr<std::byte> data;  // `count` elements of `type` (the communication dtype)
  DType type = DType::kFloat32;
  std::int64_t count = 0;
  bool final = false;               // the step's last reduction of the unit
  bool from_bucket = false;         // reduced from the bucket itself (no conversion scratch)
  DevicePtr<std::byte> grad_slice;  // the device's accumulation (accum_type); empty if none
  DType accum_type = DType::kFloat32;
  // Stages 2-3: recorded once the bucket (or the scratch `data` is in) may be written again.
  Event* reduced = nullptr;
  TraceSpan* span = nullptr;  // the reduction's span, ended where the collective work ends
};

class GradientSink {
 public:
  virtual ~GradientSink() = default;
  // Takes the slice on `comm`.
  virtual void take(const ReducedSlice& r, Stream& comm) = 0;
  // Whether `data` is still read after take() returns (by the copy stream, until r.reduced):
  // a conversion scratch holding it must not be reused before then.
  virtual bool reads_later() const = 0;
};

// Stages 2-3: accumulates into the device's gradient slice, then records `reduced`; with
// `offload` (optimizer offload; null without) the final slice is shown to it, for its sum of
// squares (and its copy down, for a unit it steps).
std::unique_ptr<GradientSink> make_device_accumulation(Device& device, OptimizerOffload* offload);
// Stages 2-3 with parameter offload: every micro-batch's slice goes down and accumulates in
// host memory.
std::unique_ptr<GradientSink> make_host_accumulation(OptimizerOffload& offload);
// Stages 2-3 at one micro-batch per step, a unit stepped on the host: the reduced slice in the
// bucket is the final gradient and goes down from there (offload_takes_reduced_slices).
std::unique_ptr<GradientSink> make_reduced_slice_to_host(OptimizerOffload& offload);
// Stages 0-1: the final slice is already in the full gradients; the offload (null: none) is
// shown it.
std::unique_ptr<GradientSink> make_full_gradient_sink(OptimizerOffload* offload);

}  // namespace zrt
