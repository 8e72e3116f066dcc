// Where the optimizer steps this rank's units, chosen once when the engine is built
// (ZeroEngine::choose_strategies, engine_strategies.cc): all on the device (DeviceStep), or the
// optimizer offload's units on the host's CPU optimizer and the rest on the device
// (OffloadStep). The step asks it for the host's part of the update and of the global norm, and
// the state's readers wait for it, so none of them asks whether there is an offload. The
// device's part of the update (device_optimizer_slices, the units whose placement keeps their
// state on the device) is the engine's either way. Private to the engine.
//
// Thread-safety: as the engine (one thread).
#pragma once

#include "runtime/engine/zero_engine.h"

namespace zrt {

class ZeroEngine::StepStrategy {
 public:
  virtual ~StepStrategy() = default;
  // The squared norm of the whole gradient, summed over ranks and read on the host: the one
  // host wait of a step decided there.
  virtual float norm_squared() = 0;
  // Enqueues the host's part of the update (1-based `step`); returns at once.
  virtual void update_on_host(std::int64_t step, double lr, double grad_scale) = 0;
  // A skipped step: what the host would have consumed starts again from zero.
  virtual void skip() = 0;
  // Blocks until the host's work (the CPU optimizer, its copies) is done; rethrows its errors.
  // Before the host state is read or replaced, and in the engine's synchronize().
  virtual void synchronize() = 0;
  // The device optimizer's trace span, after the optimizer's name.
  virtual const char* device_span_suffix() const = 0;
  // The host side's timeline trace (ZeroEngine::set_trace).
  virtual void set_trace(TraceRecorder* recorder) = 0;
};

class ZeroEngine::DeviceStep final : public ZeroEngine::StepStrategy {
 public:
  explicit DeviceStep(ZeroEngine& engine) : e_(engine) {}
  float norm_squared() override;
  void update_on_host(std::int64_t, double, double) override {}
  void skip() override {}
  void synchronize() override {}
  const char* device_span_suffix() const override { return " (all units)"; }
  void set_trace(TraceRecorder*) override {}

 private:
  ZeroEngine& e_;
};

class ZeroEngine::OffloadStep final : public ZeroEngine::StepStrategy {
 public:
  OffloadStep(ZeroEngine& engine, OptimizerOffload& offload);
  float norm_squared() override;
  void update_on_host(std::int64_t step, double lr, double grad_scale) override;
  void skip() override { offload_.skip_update(); }
  void synchronize() override { offload_.synchronize(); }
  const char* device_span_suffix() const override { return " (units on the device)"; }
  void set_trace(TraceRecorder* recorder) override { offload_.set_trace(recorder); }

 private:
  ZeroEngine& e_;
  OptimizerOffload& offload_;
  std::vector<bool> summed_over_ranks_;  // per group: whether its norm is summed over its ranks
};

}  // namespace zrt
