// The gather strategies (gather_strategy.h). Each is the collective of one path; the engine's
// ordering (events, allocations) stays in param_gather.cc.
#include "runtime/engine/gather_strategy.h"

#include "runtime/engine/unit_state.h"
#include "runtime/trace/trace_span.h"

namespace zrt {
namespace {

class AllGather final : public GatherStrategy {
 public:
  AllGather(ProcessGroup& group, DType type, const char* name)
      : group_(group), type_(type), name_(name) {}
  void gather(const UnitGather& g, Stream& comm, TraceRecorder* trace) override {
    TraceSpan span(trace, comm, TraceTrack::kComm, name_, "unit", g.unit);
    group_.all_gather(g.slice, g.full, g.shard, type_);
  }

 private:
  ProcessGroup& group_;
  DType type_;
  const char* name_;
};

class QuantizedGather final : public GatherStrategy {
 public:
  QuantizedGather(QuantizedCollectives& quantized, DType type)
      : quantized_(quantized), type_(type) {}
  void gather(const UnitGather& g, Stream& comm, TraceRecorder* trace) override {
    TraceSpan span(trace, comm, TraceTrack::kComm, "all_gather (int8)", "unit", g.unit);
    quantized_.all_gather(g.slice, g.full, g.shard, type_);
  }

 private:
  QuantizedCollectives& quantized_;
  DType type_;
};

class HostSliceGather final : public GatherStrategy {
 public:
  HostSliceGather(Device& device, OptimizerOffload& offload, ProcessGroup& group, DType type)
      : device_(device), offload_(offload), group_(group), type_(type) {}
  void gather(const UnitGather& g, Stream& comm, TraceRecorder* trace) override {
    // Into its place in the gathered buffer just before the (in-place) gather, once the CPU
    // optimizer has written it.
    const DevicePtr<std::byte> mine = g.full + bytes_of(g.rank * g.shard, type_);
    offload_.wait_for_update(g.unit, comm);
    {
      TraceSpan span(trace, comm, TraceTrack::kComm, "h2d", "unit", g.unit);
      device_.copy_to_device(mine, offload_.host_params(g.unit),
                             static_cast<std::size_t>(bytes_of(g.shard, type_)), comm);
    }
    TraceSpan span(trace, comm, TraceTrack::kComm, "all_gather", "unit", g.unit);
    group_.all_gather(mine, g.full, g.shard, type_);
  }

 private:
  Device& device_;
  OptimizerOffload& offload_;
  ProcessGroup& group_;
  DType type_;
};

}  // namespace

std::unique_ptr<GatherStrategy> make_all_gather(ProcessGroup& group, DType type) {
  return std::make_unique<AllGather>(group, type, "all_gather");
}

std::unique_ptr<GatherStrategy> make_quantized_gather(QuantizedCollectives& quantized, DType type) {
  return std::make_unique<QuantizedGather>(quantized, type);
}

std::unique_ptr<GatherStrategy> make_host_slice_gather(Device& device, OptimizerOffload& offload,
                                                       ProcessGroup& group, DType type) {
  return std::make_unique<HostSliceGather>(device, offload, group, type);
}

std::unique_ptr<GatherStrategy> make_secondary_gather(ProcessGroup& secondary, DType type) {
  return std::make_unique<AllGather>(secondary, type, "all_gather (hpZ)");
}

}  // namespace zrt
