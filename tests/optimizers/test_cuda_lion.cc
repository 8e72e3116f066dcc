// GPU parity: the fused CUDA Lion kernel against CpuLion, bit for bit (both perform lion.h's
// operations in the same order, no FMA), through the engine's seam (DeviceOptimizer::step with
// named state slices), with exact sign ties, weight decay and exempt slices. Built with the
// CUDA backend; the GPU test main exits 77 (skipped) where no GPU is usable.
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <cstring>
#include <random>

#include "optimizers/cpu_lion.h"
#include "optimizers/device_lion.h"
#include "runtime/device/cuda_device.h"
#include "runtime/device/device.h"
#include "runtime/device/device_access.h"
#include "tests/support/gpu_test_support.h"

namespace zrt {
namespace {

// A device copy of fp32 arrays (raw CUDA, independent of the device backend).
struct DeviceArray {
  void* ptr = nullptr;
  std::size_t bytes = 0;
  explicit DeviceArray(const void* host, std::size_t n) : bytes(n) {
    ZRT_CUDA_CHECK(cudaMalloc(&ptr, n));
    ZRT_CUDA_CHECK(cudaMemcpy(ptr, host, n, cudaMemcpyHostToDevice));
  }
  ~DeviceArray() { (void)cudaFree(ptr); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  void upload(const void* host) {
    ZRT_CUDA_CHECK(cudaMemcpy(ptr, host, bytes, cudaMemcpyHostToDevice));
  }
  void download(void* host) const {
    ZRT_CUDA_CHECK(cudaMemcpy(host, ptr, bytes, cudaMemcpyDeviceToHost));
  }
};

TEST_CASE("DeviceLion on the CUDA backend equals CpuLion, ties included", "[cuda_lion][gpu]") {
  DeviceOptions device_options;
  device_options.type = DeviceType::kCuda;
  device_options.index = test::gpu_index();
  auto device = make_device(device_options);
  auto stream = device->create_stream("optimizer");
  LionOptions options;
  options.beta1 = 0.5;  // m = -g gives c == 0 exactly
  options.weight_decay = 0.3;
  auto lion = make_device_lion(*device, options);
  const CpuLion reference(options);
  const std::vector<std::int64_t> sizes = {1, 5, 2048, 2049, 4099};
  std::int64_t n = 0;
  for (std::int64_t s : sizes) n += s;
  const auto un = static_cast<std::size_t>(n);
  std::vector<float> p(un), m(un, 0.0f), g(un);
  std::vector<std::uint16_t> out(un, 0);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : p) x = normal(rng);
  DeviceArray dp(p.data(), un * 4), dm(m.data(), un * 4), dg(g.data(), un * 4),
      dout(out.data(), un * 2);
  for (int t = 1; t <= 4; ++t) {
    for (std::size_t i = 0; i < un; ++i) {
      g[i] = normal(rng);
      if (i % 7 == 0 && t > 1) g[i] = -m[i];  // an exact tie: c = m + 0.5 * (-2m) = 0
    }
    dg.upload(g.data());
    std::vector<OptimizerDeviceSlice> device_slices;
    std::vector<LionSlice> host_slices;
    std::int64_t offset = 0;
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      OptimizerDeviceSlice d;
      d.param = device_access::wrap(static_cast<float*>(dp.ptr) + offset);
      d.grad = device_access::wrap(static_cast<const std::byte*>(dg.ptr) + offset * 4);
      d.state[0] = device_access::wrap(static_cast<float*>(dm.ptr) + offset);
      d.param_out = device_access::wrap(static_cast<std::byte*>(dout.ptr) + offset * 2);
      d.numel = sizes[k];
      d.grad_dtype = DType::kFloat32;
      d.out_dtype = DType::kBFloat16;
      d.weight_decay = k != 1;
      device_slices.push_back(d);
      const auto o = static_cast<std::size_t>(offset);
      host_slices.push_back(LionSlice{p.data() + o, g.data() + o, m.data() + o, out.data() + o,
                                      sizes[k], DType::kFloat32, DType::kBFloat16, k != 1});
      offset += sizes[k];
    }
    static_cast<DeviceOptimizer&>(*lion).step(device_slices, t, 1e-3 * t, *stream, 0.75);
    stream->synchronize();
    reference.step(host_slices, 1e-3 * t, 0.75);
  }
  std::vector<float> gp(un), gm(un);
  std::vector<std::uint16_t> gout(un);
  dp.download(gp.data());
  dm.download(gm.data());
  dout.download(gout.data());
  CHECK(std::memcmp(gp.data(), p.data(), un * 4) == 0);
  CHECK(std::memcmp(gm.data(), m.data(), un * 4) == 0);
  CHECK(gout == out);
  CHECK(lion->spec().state_names == std::vector<std::string>{"exp_avg"});
}

}  // namespace
}  // namespace zrt
