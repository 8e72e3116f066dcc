// GPU parity: the fused CUDA Adam kernel against CpuAdam, bit for bit (both perform adam.h's
// IEEE operations in the same order, no FMA). Built with the CUDA backend; the GPU test main
// exits 77 (skipped) where no GPU is usable.
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <cstring>

#include "optimizers/cpu_adam.h"
#include "optimizers/cuda/cuda_adam.h"
#include "optimizers/device_adam.h"
#include "runtime/device/cuda_device.h"
#include "runtime/device/device.h"
#include "runtime/device/device_access.h"
#include "tests/optimizers/adam_test_util.h"
#include "tests/support/gpu_test_support.h"

namespace zrt {
namespace {

using test::AdamProblem;

// A device copy of an AdamProblem's arrays (raw CUDA, independent of the device backend).
struct DeviceArrays {
  void* param = nullptr;
  void* m = nullptr;
  void* v = nullptr;
  void* grad = nullptr;
  void* out = nullptr;

  explicit DeviceArrays(const AdamProblem& p) {
    ZRT_CUDA_CHECK(cudaMalloc(&param, p.param.size() * 4));
    ZRT_CUDA_CHECK(cudaMalloc(&m, p.exp_avg.size() * 4));
    ZRT_CUDA_CHECK(cudaMalloc(&v, p.exp_avg_sq.size() * 4));
    ZRT_CUDA_CHECK(cudaMalloc(&grad, p.grad.size()));
    ZRT_CUDA_CHECK(cudaMalloc(&out, p.out.size()));
    ZRT_CUDA_CHECK(cudaMemcpy(param, p.param.data(), p.param.size() * 4, cudaMemcpyHostToDevice));
    ZRT_CUDA_CHECK(cudaMemcpy(m, p.exp_avg.data(), p.exp_avg.size() * 4, cudaMemcpyHostToDevice));
    ZRT_CUDA_CHECK(
        cudaMemcpy(v, p.exp_avg_sq.data(), p.exp_avg_sq.size() * 4, cudaMemcpyHostToDevice));
    ZRT_CUDA_CHECK(cudaMemcpy(out, p.out.data(), p.out.size(), cudaMemcpyHostToDevice));
  }
  ~DeviceArrays() {
    for (void* ptr : {param, m, v, grad, out}) (void)cudaFree(ptr);
  }
  DeviceArrays(const DeviceArrays&) = delete;
  DeviceArrays& operator=(const DeviceArrays&) = delete;

  std::vector<AdamDeviceSlice> slices(const AdamProblem& p) const {
    std::vector<AdamDeviceSlice> out_slices;
    for (std::size_t k = 0; k < p.sizes.size(); ++k) {
      const std::int64_t o = p.offsets[k];
      AdamDeviceSlice s;
      s.param = device_access::wrap(static_cast<float*>(param) + o);
      s.grad = device_access::wrap(static_cast<const std::byte*>(grad) +
                                   o * static_cast<std::int64_t>(dtype_size(p.grad_dtype)));
      s.exp_avg = device_access::wrap(static_cast<float*>(m) + o);
      s.exp_avg_sq = device_access::wrap(static_cast<float*>(v) + o);
      if (p.with_out) {
        s.param_out = device_access::wrap(static_cast<std::byte*>(out) +
                                          o * static_cast<std::int64_t>(dtype_size(p.out_dtype)));
      }
      s.numel = p.sizes[k];
      s.grad_dtype = p.grad_dtype;
      s.out_dtype = p.out_dtype;
      s.weight_decay = p.decay[k];
      out_slices.push_back(s);
    }
    return out_slices;
  }

  // Copies the device results into a problem-shaped host copy.
  void download(AdamProblem& into) const {
    ZRT_CUDA_CHECK(
        cudaMemcpy(into.param.data(), param, into.param.size() * 4, cudaMemcpyDeviceToHost));
    ZRT_CUDA_CHECK(
        cudaMemcpy(into.exp_avg.data(), m, into.exp_avg.size() * 4, cudaMemcpyDeviceToHost));
    ZRT_CUDA_CHECK(
        cudaMemcpy(into.exp_avg_sq.data(), v, into.exp_avg_sq.size() * 4, cudaMemcpyDeviceToHost));
    ZRT_CUDA_CHECK(cudaMemcpy(into.out.data(), out, into.out.size(), cudaMemcpyDeviceToHost));
  }
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST_CASE("CudaAdam equals CpuAdam bit for bit", "[cuda_adam][gpu]") {
  ZRT_CUDA_CHECK(cudaSetDevice(test::gpu_index()));
  struct Case {
    const char* name;
    bool adam_w_mode;
    bool bias_correction;
    DType grad;
    bool with_out;
    DType out;
    double grad_scale = 1.0;
  };
  const Case cases[] = {
      {"adamw fp32", true, true, DType::kFloat32, false, DType::kBFloat16},
      {"adamw bf16 grads, bf16 out", true, true, DType::kBFloat16, true, DType::kBFloat16},
      {"adamw fp16 grads, fp16 out", true, true, DType::kFloat16, true, DType::kFloat16},
      {"adam l2, fp32 out", false, true, DType::kFloat32, true, DType::kFloat32},
      {"adamw no bias correction", true, false, DType::kFloat32, true, DType::kBFloat16},
      {"adamw fp16 grads, grad_scale 0.37", true, true, DType::kFloat16, true, DType::kFloat16,
       0.37},
  };
  std::vector<std::int64_t> sizes = test::default_slice_sizes();
  sizes.push_back(300001);  // many blocks for one slice
  cudaStream_t stream;
  ZRT_CUDA_CHECK(cudaStreamCreate(&stream));
  for (const Case& c : cases) {
    INFO(c.name);
    AdamOptions options;
    options.weight_decay = 0.01;
    options.adam_w_mode = c.adam_w_mode;
    options.bias_correction = c.bias_correction;
    AdamProblem cpu(sizes, c.grad, c.with_out, c.out, 17);
    AdamProblem gpu(sizes, c.grad, c.with_out, c.out, 17);
    DeviceArrays device(gpu);
    CudaAdam cuda_adam(options);
    const CpuAdam cpu_adam(options);
    const auto slices = device.slices(gpu);
    for (std::int64_t t = 1; t <= 20; ++t) {
      cpu.make_grads(t, 5);
      ZRT_CUDA_CHECK(cudaMemcpyAsync(device.grad, cpu.grad.data(), cpu.grad.size(),
                                     cudaMemcpyHostToDevice, stream));
      const double lr = 1e-3 * static_cast<double>(t);
      cuda_adam.step(slices, t, lr, stream, c.grad_scale);
      cpu_adam.step(cpu.slices(), t, lr, c.grad_scale);
      ZRT_CUDA_CHECK(cudaStreamSynchronize(stream));
    }
    device.download(gpu);
    CHECK(same_bits(gpu.param, cpu.param));
    CHECK(same_bits(gpu.exp_avg, cpu.exp_avg));
    CHECK(same_bits(gpu.exp_avg_sq, cpu.exp_avg_sq));
    CHECK(gpu.out == cpu.out);
    CHECK(gpu.guards_intact());
  }
  ZRT_CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST_CASE("DeviceAdam on the CUDA backend equals CpuAdam", "[cuda_adam][gpu]") {
  DeviceOptions device_options;
  device_options.type = DeviceType::kCuda;
  device_options.index = test::gpu_index();
  auto device = make_device(device_options);
  auto stream = device->create_stream("optimizer");
  AdamOptions options;
  options.weight_decay = 0.1;
  auto adam = make_device_adam(*device, options);
  AdamProblem cpu(test::default_slice_sizes(), DType::kBFloat16, true, DType::kBFloat16, 4);
  AdamProblem gpu(test::default_slice_sizes(), DType::kBFloat16, true, DType::kBFloat16, 4);
  DeviceArrays arrays(gpu);
  const CpuAdam reference(options);
  for (std::int64_t t = 1; t <= 3; ++t) {
    cpu.make_grads(t, 8);
    ZRT_CUDA_CHECK(
        cudaMemcpy(arrays.grad, cpu.grad.data(), cpu.grad.size(), cudaMemcpyHostToDevice));
    adam->step(arrays.slices(gpu), t, 2e-3, *stream);
    stream->synchronize();
    reference.step(cpu.slices(), t, 2e-3);
  }
  arrays.download(gpu);
  CHECK(same_bits(gpu.param, cpu.param));
  CHECK(gpu.out == cpu.out);
}

TEST_CASE("CudaAdam reads a device-resident step decision when it runs", "[cuda_adam][gpu]") {
  AdamOptions options;
  options.weight_decay = 0.1;
  const CpuAdam reference(options);
  CudaAdam adam(options);
  AdamProblem cpu(test::default_slice_sizes(), DType::kFloat32, true, DType::kBFloat16, 5);
  AdamProblem gpu(test::default_slice_sizes(), DType::kFloat32, true, DType::kBFloat16, 5);
  DeviceArrays arrays(gpu);
  StepDecision* decision = nullptr;
  ZRT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&decision), sizeof(StepDecision)));
  auto decide = [&](float grad_scale, int apply) {
    const StepDecision d{grad_scale, apply};
    ZRT_CUDA_CHECK(cudaMemcpy(decision, &d, sizeof d, cudaMemcpyHostToDevice));
  };
  cpu.make_grads(1, 8);
  ZRT_CUDA_CHECK(cudaMemcpy(arrays.grad, cpu.grad.data(), cpu.grad.size(), cudaMemcpyHostToDevice));
  // Applied: the decision's grad_scale, not the argument's.
  decide(0.375f, 1);
  adam.step(arrays.slices(gpu), 1, 2e-3, nullptr, /*grad_scale=*/1.0, decision);
  reference.step(cpu.slices(), 1, 2e-3, 0.375);
  ZRT_CUDA_CHECK(cudaDeviceSynchronize());
  AdamProblem after_first = gpu;
  arrays.download(after_first);
  CHECK(same_bits(after_first.param, cpu.param));
  CHECK(same_bits(after_first.exp_avg, cpu.exp_avg));
  CHECK(after_first.out == cpu.out);
  // Not applied: nothing is written.
  decide(0.375f, 0);
  adam.step(arrays.slices(gpu), 2, 2e-3, nullptr, 1.0, decision);
  ZRT_CUDA_CHECK(cudaDeviceSynchronize());
  AdamProblem after_skip = gpu;
  arrays.download(after_skip);
  CHECK(same_bits(after_skip.param, after_first.param));
  CHECK(same_bits(after_skip.exp_avg, after_first.exp_avg));
  CHECK(same_bits(after_skip.exp_avg_sq, after_first.exp_avg_sq));
  CHECK(after_skip.out == after_first.out);
  (void)cudaFree(decision);
}

}  // namespace
}  // namespace zrt
