// The reduction strategies (reduce_strategy.h): the collectives and the sinks of the reduced
// slices. The engine's ordering (events, conversions, the scratch's reuse) stays in
// gradient_reduction.cc.
#include "runtime/engine/reduce_strategy.h"

#include "runtime/common/error.h"
#include "runtime/engine/engine_kernels.h"
#include "runtime/engine/unit_state.h"

namespace zrt {
namespace {

// Hierarchical sharding: the shard group's average, averaged again over the replicas of the
// slice (the same stream: in order after the reduce-scatter).
void average_over(ProcessGroup* replicas, DevicePtr<std::byte> slice, std::int64_t count,
                  DType type) {
  if (replicas != nullptr) replicas->all_reduce(slice, slice, count, type, ReduceOp::kAvg);
}

class AllReduce final : public GradientCollective {
 public:
  explicit AllReduce(ProcessGroup& group) : group_(group) {}
  const char* name() const override { return "all_reduce"; }
  ReducedPart reduce(DevicePtr<std::byte> grads, std::int64_t shard, int /*rank*/,
                     DType type) override {
    // Stage 0's units are not sliced: `shard` is the whole unit.
    group_.all_reduce(grads, grads, shard, type, ReduceOp::kAvg);
    return {grads, 0, shard};
  }

 private:
  ProcessGroup& group_;
};

class ReduceScatter final : public GradientCollective {
 public:
  ReduceScatter(ProcessGroup& group, ProcessGroup* replicas) : group_(group), replicas_(replicas) {}
  const char* name() const override { return "reduce_scatter"; }
  ReducedPart reduce(DevicePtr<std::byte> grads, std::int64_t shard, int rank,
                     DType type) override {
    const DevicePtr<std::byte> mine = grads + bytes_of(rank * shard, type);
    group_.reduce_scatter(grads, mine, shard, type, ReduceOp::kAvg);
    average_over(replicas_, mine, shard, type);
    return {mine, rank * shard, shard};
  }

 private:
  ProcessGroup& group_;
  ProcessGroup* replicas_;
};

class QuantizedReduceScatter final : public GradientCollective {
 public:
  QuantizedReduceScatter(QuantizedCollectives& quantized, ProcessGroup* replicas,
                         DevicePtr<std::byte> out)
      : quantized_(quantized), replicas_(replicas), out_(out) {}
  const char* name() const override { return "reduce_scatter"; }
  ReducedPart reduce(DevicePtr<std::byte> grads, std::int64_t shard, int rank,
                     DType type) override {
    quantized_.reduce_scatter(grads, out_, shard, type, ReduceOp::kAvg);
    average_over(replicas_, out_, shard, type);
    return {out_, rank * shard, shard};
  }

 private:
  QuantizedCollectives& quantized_;
  ProcessGroup* replicas_;
  DevicePtr<std::byte> out_;
};

class Scaled final : public GradientCollective {
 public:
  Scaled(GradientCollective& inner, Device& device, Stream& stream, float factor)
      : inner_(inner), device_(device), stream_(stream), factor_(factor) {}
  const char* name() const override { return inner_.name(); }
  ReducedPart reduce(DevicePtr<std::byte> grads, std::int64_t shard, int rank,
                     DType type) override {
    const ReducedPart mine = inner_.reduce(grads, shard, rank, type);
    engine_kernels::scale(device_, stream_, mine.data, type, mine.count, factor_);
    return mine;
  }
  // It changes the values even where the inner collective moves nothing.
  bool communicates() const override { return true; }

 private:
  GradientCollective& inner_;
  Device& device_;
  Stream& stream_;
  float factor_;
};

class NoReduction final : public GradientCollective {
 public:
  explicit NoReduction(const char* name) : name_(name) {}
  const char* name() const override { return name_; }
  ReducedPart reduce(DevicePtr<std::byte> grads, std::int64_t shard, int rank,
                     DType type) override {
    return {grads + bytes_of(rank * shard, type), rank * shard, shard};
  }
  bool communicates() const override { return false; }

 private:
  const char* name_;
};

class DeviceAccumulation : public GradientSink {
 public:
  explicit DeviceAccumulation(Device& device) : device_(device) {}
  void take(const ReducedSlice& r, Stream& comm) override {
    engine_kernels::accumulate(device_, comm, r.data, r.type, r.grad_slice, r.accum_type, r.count);
    r.span->end();
    r.reduced->record(comm);
  }
  bool reads_later() const override { return false; }

 private:
  Device& device_;
};

// With optimizer offload every unit's final gradient passes through the offload, which takes
// its sum of squares where the reduction left it, so the norm adds the units in one order
// whichever side steps them.
class DeviceAccumulationShown final : public DeviceAccumulation {
 public:
  DeviceAccumulationShown(Device& device, OptimizerOffload& offload)
      : DeviceAccumulation(device), offload_(offload) {}
  void take(const ReducedSlice& r, Stream& comm) override {
    DeviceAccumulation::take(r, comm);
    if (r.final) offload_.gradient_reduced(r.unit, r.grad_slice, r.accum_type, true, nullptr);
  }

 private:
  OptimizerOffload& offload_;
};

class HostAccumulation final : public GradientSink {
 public:
  explicit HostAccumulation(OptimizerOffload& offload) : offload_(offload) {}
  void take(const ReducedSlice& r, Stream& /*comm*/) override {
    // It goes down from where the reduction left it, in the communication dtype (an fp32
    // reduction keeps its precision); the copy stream records `reduced` once it has read it.
    r.span->end();
    offload_.gradient_reduced(r.unit, r.data, r.type, r.final, r.reduced);
  }
  bool reads_later() const override { return true; }

 private:
  OptimizerOffload& offload_;
};

class ReducedSliceToHost final : public GradientSink {
 public:
  explicit ReducedSliceToHost(OptimizerOffload& offload) : offload_(offload) {}
  void take(const ReducedSlice& r, Stream& /*comm*/) override {
    // The bucket is freed once the copy has read it (`reduced` is recorded on the copy stream
    // then).
    ZRT_CHECK(r.final && r.from_bucket,
              "unit {} has no device gradient slice but its reduced slice is not the final "
              "one in the bucket",
              r.unit);
    r.span->end();
    offload_.gradient_reduced(r.unit, r.data, r.type, true, r.reduced);
  }
  bool reads_later() const override { return true; }

 private:
  OptimizerOffload& offload_;
};

class FullGradients final : public GradientSink {
 public:
  void take(const ReducedSlice& r, Stream& /*comm*/) override { r.span->end(); }
  bool reads_later() const override { return false; }
};

class FullGradientsShown final : public GradientSink {
 public:
  explicit FullGradientsShown(OptimizerOffload& offload) : offload_(offload) {}
  void take(const ReducedSlice& r, Stream& /*comm*/) override {
    r.span->end();
    offload_.gradient_reduced(r.unit, r.grad_slice, r.accum_type, true, nullptr);
  }
  bool reads_later() const override { return false; }

 private:
  OptimizerOffload& offload_;
};

}  // namespace

std::unique_ptr<GradientCollective> make_all_reduce(ProcessGroup& group) {
  return std::make_unique<AllReduce>(group);
}

std::unique_ptr<GradientCollective> make_reduce_scatter(ProcessGroup& group,
                                                        ProcessGroup* replicas) {
  return std::make_unique<ReduceScatter>(group, replicas);
}

std::unique_ptr<GradientCollective> make_scaled(GradientCollective& inner, Device& device,
                                                Stream& stream, float factor) {
  return std::make_unique<Scaled>(inner, device, stream, factor);
}

std::unique_ptr<GradientCollective> make_no_reduction(const char* name) {
  return std::make_unique<NoReduction>(name);
}

std::unique_ptr<GradientCollective> make_quantized_reduce_scatter(QuantizedCollectives& quantized,
                                                                  ProcessGroup* replicas,
                                                                  DevicePtr<std::byte> out) {
  return std::make_unique<QuantizedReduceScatter>(quantized, replicas, out);
}

std::unique_ptr<GradientSink> make_device_accumulation(Device& device, OptimizerOffload* offload) {
  if (offload == nullptr) return std::make_unique<DeviceAccumulation>(device);
  return std::make_unique<DeviceAccumulationShown>(device, *offload);
}

std::unique_ptr<GradientSink> make_host_accumulation(OptimizerOffload& offload) {
  return std::make_unique<HostAccumulation>(offload);
}

std::unique_ptr<GradientSink> make_reduced_slice_to_host(OptimizerOffload& offload) {
  return std::make_unique<ReducedSliceToHost>(offload);
}

std::unique_ptr<GradientSink> make_full_gradient_sink(OptimizerOffload* offload) {
  if (offload == nullptr) return std::make_unique<FullGradients>();
  return std::make_unique<FullGradientsShown>(*offload);
}

}  // namespace zrt
