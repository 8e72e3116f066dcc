// FlatParamAccess: the trivial single-process ParamAccess — every parameter and every gradient
// resident in two flat device buffers, acquire/release only checked and logged. For tests, the
// benchmark and single-device runs; the ZeRO engine provides the real one.
//
// It enforces the protocol in runtime/model_interface.h: acquire/release pairing with matching
// phases, param(i) only while a module using i is acquired, grad(i) only in backward. Every
// acquire/release is appended to log() as "acquire 3 forward", "release 3 backward", ...
//
// Not thread-safe. Host-side helpers that read or write values synchronize the stream.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/device/buffer.h"
#include "runtime/device/device.h"
#include "runtime/model_interface.h"

namespace zrt {

class FlatParamAccess final : public ParamAccess {
 public:
  // Allocates parameters (MemCategory::kParams, compute dtype) and gradients (kGrads,
  // grad dtype), each parameter aligned to 64 elements; gradients zeroed. `num_modules` bounds
  // the module ids of specs. Stream: where copies and zeroing are enqueued (the model's).
  FlatParamAccess(Device& device, Stream& stream, std::vector<ParamSpec> specs, int num_modules,
                  DType compute_dtype, DType grad_dtype);
  // Waits for the stream (work on it may still read the buffers), then frees them.
  ~FlatParamAccess() override;
  FlatParamAccess(const FlatParamAccess&) = delete;
  FlatParamAccess& operator=(const FlatParamAccess&) = delete;

  void acquire(int module, Phase phase) override;
  void release(int module, Phase phase) override;
  DevicePtr<std::byte> param(int index) override;
  DevicePtr<std::byte> grad(int index) override;
  DType compute_dtype() const override { return compute_dtype_; }
  DType grad_dtype() const override { return grad_dtype_; }
  // ParamSpec::frozen of the specs it was given.
  bool trains(int index) const override;
  // 0 unless set: a model that stops its backward early then ends it at `module`, and a backward
  // or recompute acquire below it throws (as the engine's schedule does).
  int first_backward_module() const override { return first_backward_module_; }
  void set_first_backward_module(int module);

  const std::vector<ParamSpec>& specs() const { return specs_; }
  // Initialises every parameter with model.init_parameter(seed) (synchronous).
  void init_from(const Model& model, std::uint64_t seed);
  // Writes host fp32 values (rounded to the compute dtype) into parameter `index` (synchronous).
  void set_param(int index, const std::vector<float>& values);
  // Reads parameter / gradient `index` as fp32 (synchronizes the stream).
  std::vector<float> read_param(int index);
  std::vector<float> read_grad(int index);
  // Enqueues zeroing of every gradient.
  void zero_grads();

  const std::vector<std::string>& log() const { return log_; }
  void clear_log() { log_.clear(); }

 private:
  bool acquired_in(int index, bool backward) const;

  Device& device_;
  Stream& stream_;
  std::vector<ParamSpec> specs_;
  DType compute_dtype_;
  DType grad_dtype_;
  std::vector<std::int64_t> offsets_;  // element offset of each parameter (same in both buffers)
  Buffer params_;
  Buffer grads_;
  std::vector<int> state_;  // per module: -1 released, else the Phase it was acquired in
  std::vector<std::string> log_;
  int first_backward_module_ = 0;
};

}  // namespace zrt
