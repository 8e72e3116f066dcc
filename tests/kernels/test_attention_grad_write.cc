// The attention backwards' GradWrite (kernels/grad_write.h, ops.h) on the CPU backend:
// kIntoZeros into zeroed gradients gives kAccumulate's bits; kIntoZeros into a gradient that is
// not zero is an error naming the tensor and the fix (the check that holds the models' promise,
// which lets cuDNN's attention write straight into the gradients); kOverwrite from any values,
// NaN included, gives kAccumulate's bits into zeros (the CPU twin zeroes first).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "kernels/kernel_context.h"
#include "kernels/ops.h"
#include "runtime/device/device.h"

namespace zrt::kernels {
namespace {

// Values in [-1, 1) from a fixed LCG (the same on every machine), `stream` apart.
std::vector<double> values(std::uint32_t stream, std::size_t n) {
  std::vector<double> out(n);
  std::uint32_t state = 0x9e3779b9u * (stream + 1);
  for (double& x : out) {
    state = state * 1664525u + 1013904223u;
    x = static_cast<double>(state >> 8) / static_cast<double>(1u << 23) - 1.0;
  }
  return out;
}

// GPT-2's packed layout, or Llama's grouped-query tensors (nkv < nh), fp32 on the CPU.
struct Case {
  int B = 2, T = 24, NH = 4, NKV = 2, hs = 8;
};

struct Cpu {
  std::unique_ptr<Device> device = make_device(DeviceOptions{});
  std::unique_ptr<Stream> stream = device->create_stream("compute");
  KernelContext ctx{*device, *stream};
  std::vector<Buffer> buffers;
  Cpu() = default;
  Cpu(const Cpu&) = delete;
  Cpu& operator=(const Cpu&) = delete;
  // The buffers go when the stream is done with them, also after an error (the work enqueued
  // before a throw still reads them).
  ~Cpu() {
    try {
      stream->synchronize();
    } catch (const std::exception&) {  // the error a case expects; already reported to it
    }
  }
  Bytes put(const std::vector<double>& values) {
    std::vector<float> f(values.begin(), values.end());
    Buffer b =
        device->allocate(static_cast<std::int64_t>(f.size() * 4), MemCategory::kOther, "test");
    device->copy_to_device(b.device<std::byte>(), f.data(), f.size() * 4, *stream);
    stream->synchronize();
    buffers.push_back(std::move(b));
    return buffers.back().device<std::byte>();
  }
  std::vector<float> get(Bytes p, std::size_t n) {
    std::vector<float> f(n);
    device->copy_to_host(f.data(), p, n * 4, *stream);
    stream->synchronize();
    return f;
  }
};

// Forward, then the backward with `write` into gradients that start at `start` (0: zeros);
// returns the gradients (dq, dk, dv one after another; for the packed layout dqkv).
std::vector<float> run(const Case& c, bool packed, GradWrite write, double start) {
  Cpu cpu;
  const std::size_t rows = static_cast<std::size_t>(c.B) * c.T;
  const std::size_t nq = rows * c.NH * c.hs, nkv = rows * (packed ? c.NH : c.NKV) * c.hs;
  const Bytes out = cpu.put(std::vector<double>(nq, 0.0));
  const Floats lse =
      cpu.put(std::vector<double>(static_cast<std::size_t>(c.B) * c.NH * c.T, 0.0)).as<float>();
  const Bytes dout = cpu.put(values(4, nq));
  if (packed) {
    const int C = c.NH * c.hs;
    const Bytes qkv = cpu.put(values(1, 3 * nq));
    const Bytes dqkv = cpu.put(std::vector<double>(3 * nq, start));
    attention_forward(cpu.ctx, DType::kFloat32, out, lse, qkv, c.B, c.T, C, c.NH);
    attention_backward(cpu.ctx, DType::kFloat32, dqkv, dout, qkv, out, lse, c.B, c.T, C, c.NH, {},
                       0, write);
    return cpu.get(dqkv, 3 * nq);
  }
  const Bytes q = cpu.put(values(1, nq));
  const Bytes k = cpu.put(values(2, nkv));
  const Bytes v = cpu.put(values(3, nkv));
  const Bytes dq = cpu.put(std::vector<double>(nq, start));
  const Bytes dk = cpu.put(std::vector<double>(nkv, start));
  const Bytes dv = cpu.put(std::vector<double>(nkv, start));
  gqa_attention_forward(cpu.ctx, DType::kFloat32, out, lse, q, k, v, c.B, c.T, c.NH, c.NKV, c.hs);
  gqa_attention_backward(cpu.ctx, DType::kFloat32, dq, dk, dv, dout, q, k, v, out, lse, c.B, c.T,
                         c.NH, c.NKV, c.hs, {}, 0, write);
  std::vector<float> all = cpu.get(dq, nq);
  for (const Bytes b : {dk, dv}) {
    const std::vector<float> part = cpu.get(b, nkv);
    all.insert(all.end(), part.begin(), part.end());
  }
  return all;
}

TEST_CASE("attention backward into zeroed gradients: kIntoZeros gives kAccumulate's bits",
          "[kernels][attention]") {
  for (const bool packed : {true, false}) {
    INFO((packed ? "packed qkv" : "grouped-query"));
    const std::vector<float> accumulated = run(Case{}, packed, GradWrite::kAccumulate, 0.0);
    const std::vector<float> into_zeros = run(Case{}, packed, GradWrite::kIntoZeros, 0.0);
    REQUIRE(accumulated.size() == into_zeros.size());
    CHECK(std::memcmp(accumulated.data(), into_zeros.data(), accumulated.size() * 4) == 0);
    // Not vacuous: the gradients are not all zero, and accumulating onto ones adds ones.
    CHECK(std::any_of(accumulated.begin(), accumulated.end(), [](float x) { return x != 0.0f; }));
    const std::vector<float> onto_ones = run(Case{}, packed, GradWrite::kAccumulate, 1.0);
    CHECK(onto_ones[5] == accumulated[5] + 1.0f);
  }
}

TEST_CASE("attention backward with kIntoZeros into a gradient that is not zero is an error",
          "[kernels][attention]") {
  CHECK_THROWS_WITH(run(Case{}, true, GradWrite::kIntoZeros, 1.0),
                    Catch::Contains("attention_backward: GradWrite::kIntoZeros, but dqkv is not "
                                    "zero (element 0") &&
                        Catch::Contains("zero the gradient"));
  CHECK_THROWS_WITH(run(Case{}, false, GradWrite::kIntoZeros, 1.0),
                    Catch::Contains("gqa_attention_backward: GradWrite::kIntoZeros, but dq is not "
                                    "zero"));
}

TEST_CASE("attention backward with kOverwrite gives kAccumulate-into-zeros' bits from any start",
          "[kernels][attention]") {
  for (const bool packed : {true, false}) {
    INFO((packed ? "packed qkv" : "grouped-query"));
    const std::vector<float> accumulated = run(Case{}, packed, GradWrite::kAccumulate, 0.0);
    for (const double start : {1.0, std::nan("")}) {
      const std::vector<float> overwritten = run(Case{}, packed, GradWrite::kOverwrite, start);
      REQUIRE(overwritten.size() == accumulated.size());
      CHECK(std::memcmp(accumulated.data(), overwritten.data(), accumulated.size() * 4) == 0);
    }
  }
}

}  // namespace
}  // namespace zrt::kernels
