// CpuAdam: float64 reference on every ISA the machine has, bit-identical results across ISAs
// and thread counts, torch.optim golden values, weight-decay flags, slice validation, and the
// stream-ordered DeviceAdam on the CPU backend.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "optimizers/cpu_adam.h"
#include "optimizers/device_adam.h"
#include "runtime/common/error.h"
#include "runtime/device/device.h"
#include "runtime/device/device_access.h"
#include "tests/optimizers/adam_test_util.h"

namespace zrt {
namespace {

using test::AdamProblem;
using test::ReferenceAdam;

struct Config {
  const char* name;
  AdamOptions options;
  DType grad_dtype;
  bool with_out;
  DType out_dtype;
  double grad_scale = 1.0;  // e.g. 1 / (loss scale * clip factor)
};

std::vector<Config> configs() {
  AdamOptions adamw;
  adamw.weight_decay = 0.01;
  AdamOptions l2 = adamw;
  l2.adam_w_mode = false;
  AdamOptions no_bc = adamw;
  no_bc.bias_correction = false;
  AdamOptions gpt;
  gpt.beta2 = 0.95;
  gpt.eps = 1e-6;
  gpt.weight_decay = 0.1;
  AdamOptions plain;  // DeepSpeed default: no weight decay
  return {
      {"adamw fp32 grads", adamw, DType::kFloat32, false, DType::kBFloat16},
      {"adamw bf16 grads, bf16 out", adamw, DType::kBFloat16, true, DType::kBFloat16},
      {"adamw fp16 grads, fp16 out", adamw, DType::kFloat16, true, DType::kFloat16},
      {"adam l2, fp32 out", l2, DType::kFloat32, true, DType::kFloat32},
      {"adam l2 bf16 grads", l2, DType::kBFloat16, false, DType::kBFloat16},
      {"adamw no bias correction, bf16 out", no_bc, DType::kFloat32, true, DType::kBFloat16},
      {"adamw betas (0.9, 0.95) wd 0.1, fp16 out", gpt, DType::kFloat32, true, DType::kFloat16},
      {"adam no weight decay", plain, DType::kFloat32, true, DType::kBFloat16},
      {"adamw fp16 grads, grad_scale 1/(1024*1.7)", adamw, DType::kFloat16, true, DType::kBFloat16,
       1.0 / (1024 * 1.7)},
  };
}

double step_lr(std::int64_t t) {
  return 1e-3 * (0.5 + 0.05 * static_cast<double>(t % 10));
}

// The compute-dtype copy must equal the rounding of the fp32 master weight, bit for bit.
void check_out_matches_param(const AdamProblem& p) {
  if (!p.with_out) return;
  std::size_t bad = 0;
  p.for_each_element([&](std::size_t i) {
    if (p.out_dtype == DType::kFloat32) {
      float f;
      std::memcpy(&f, &p.out[i * 4], 4);
      bad += std::memcmp(&f, &p.param[i], 4) != 0;
    } else {
      std::uint16_t h;
      std::memcpy(&h, &p.out[i * 2], 2);
      const std::uint16_t want =
          p.out_dtype == DType::kBFloat16 ? to_bf16(p.param[i]).bits : to_fp16(p.param[i]).bits;
      bad += h != want;
    }
  });
  CHECK(bad == 0);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST_CASE("CpuAdam matches a float64 reference on every ISA (100 steps)", "[cpu_adam]") {
  const auto isas = supported_cpu_isas();
  INFO("best ISA here: " << cpu_isa_name(best_cpu_isa()));
  REQUIRE(isas.front() == CpuIsa::kScalar);
  constexpr int kSteps = 100;
  for (const Config& c : configs()) {
    std::vector<AdamProblem> results;
    double worst[3] = {0, 0, 0};
    for (CpuIsa isa : isas) {
      INFO(c.name << ", isa " << cpu_isa_name(isa));
      AdamProblem p(test::default_slice_sizes(), c.grad_dtype, c.with_out, c.out_dtype, 42);
      ReferenceAdam ref(p);
      CpuAdam adam(c.options, CpuAdamOptions{isa, 2});
      REQUIRE(adam.isa() == isa);
      for (std::int64_t t = 1; t <= kSteps; ++t) {
        p.make_grads(t, 7);
        adam.step(p.slices(), t, step_lr(t), c.grad_scale);
        ref.step(p, c.options, t, step_lr(t), c.grad_scale);
      }
      CHECK(p.guards_intact());
      check_out_matches_param(p);
      for (std::size_t k = 0; k < p.sizes.size(); ++k) {
        INFO("slice " << k << " (" << p.sizes[k] << " elements)");
        const double e[3] = {test::relative_l2(p, k, p.param, ref.param),
                             test::relative_l2(p, k, p.exp_avg, ref.exp_avg),
                             test::relative_l2(p, k, p.exp_avg_sq, ref.exp_avg_sq)};
        CHECK(e[0] <= 1e-6);
        CHECK(e[1] <= 1e-6);
        CHECK(e[2] <= 1e-6);
        for (int j = 0; j < 3; ++j) worst[j] = std::max(worst[j], e[j]);
      }
      results.push_back(std::move(p));
    }
    // Every ISA performs the same IEEE operations: identical bits.
    for (std::size_t r = 1; r < results.size(); ++r) {
      INFO(c.name << ": " << cpu_isa_name(isas[r]) << " vs scalar");
      CHECK(same_bits(results[r].param, results[0].param));
      CHECK(same_bits(results[r].exp_avg, results[0].exp_avg));
      CHECK(same_bits(results[r].exp_avg_sq, results[0].exp_avg_sq));
      CHECK(results[r].out == results[0].out);
    }
    std::printf("  %-42s max rel L2 vs float64 after %d steps: param %.2e  m %.2e  v %.2e\n",
                c.name, kSteps, worst[0], worst[1], worst[2]);
  }
}

TEST_CASE("CpuAdam results do not depend on the thread count", "[cpu_adam]") {
  const std::vector<std::int64_t> sizes = {100003, 7, 65536, 70001, 1, 33};
  AdamOptions options;
  options.weight_decay = 0.05;
  for (CpuIsa isa : supported_cpu_isas()) {
    for (DType grad : {DType::kFloat32, DType::kBFloat16}) {
      INFO("isa " << cpu_isa_name(isa) << ", grads " << dtype_name(grad));
      AdamProblem one(sizes, grad, true, DType::kBFloat16, 3);
      AdamProblem two(sizes, grad, true, DType::kBFloat16, 3);
      const CpuAdam single(options, CpuAdamOptions{isa, 1});
      const CpuAdam dual(options, CpuAdamOptions{isa, 2});
      for (std::int64_t t = 1; t <= 3; ++t) {
        one.make_grads(t, 11);
        two.make_grads(t, 11);
        single.step(one.slices(), t, 1e-3);
        dual.step(two.slices(), t, 1e-3);
      }
      CHECK(same_bits(one.param, two.param));
      CHECK(same_bits(one.exp_avg, two.exp_avg));
      CHECK(same_bits(one.exp_avg_sq, two.exp_avg_sq));
      CHECK(one.out == two.out);
      CHECK(two.guards_intact());
    }
  }
}

TEST_CASE("long ranges (streamed compute-dtype copy) equal the scalar path", "[cpu_adam]") {
  // Ranges of >= 2^14 elements (kStreamMin) take the vector kernels' non-temporal copy-out, after a
  // scalar peel up to the store alignment; the odd leading slice sizes misalign the later slices.
  const std::vector<std::int64_t> sizes = {3, (1 << 20) + 37, 5, (1 << 20) + 1};
  AdamOptions options;
  options.weight_decay = 0.02;
  for (DType out : {DType::kBFloat16, DType::kFloat16, DType::kFloat32}) {
    AdamProblem reference(sizes, DType::kBFloat16, true, out, 21);
    const CpuAdam scalar(options, CpuAdamOptions{CpuIsa::kScalar, 1});
    for (std::int64_t t = 1; t <= 2; ++t) {
      reference.make_grads(t, 4);
      scalar.step(reference.slices(), t, 1e-3);
    }
    for (CpuIsa isa : supported_cpu_isas()) {
      if (isa == CpuIsa::kScalar) continue;
      INFO("isa " << cpu_isa_name(isa) << ", out " << dtype_name(out));
      AdamProblem p(sizes, DType::kBFloat16, true, out, 21);
      const CpuAdam adam(options, CpuAdamOptions{isa, 1});
      for (std::int64_t t = 1; t <= 2; ++t) {
        p.make_grads(t, 4);
        adam.step(p.slices(), t, 1e-3);
      }
      CHECK(same_bits(p.param, reference.param));
      CHECK(same_bits(p.exp_avg_sq, reference.exp_avg_sq));
      CHECK(p.out == reference.out);
      CHECK(p.guards_intact());
    }
  }
}

nlohmann::json load_golden() {
  std::ifstream in(ZRT_GOLDEN_DIR "/adamw_golden.json");
  REQUIRE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::json::parse(text.str());
}

std::vector<float> floats(const nlohmann::json& array) {
  std::vector<float> out;
  for (const auto& x : array) out.push_back(static_cast<float>(x.get<double>()));
  return out;
}

TEST_CASE("CpuAdam matches torch.optim.AdamW / Adam golden values", "[cpu_adam][golden]") {
  const nlohmann::json golden = load_golden();
  REQUIRE(golden["cases"].size() >= 3);
  for (const auto& c : golden["cases"]) {
    const OptimizerConfig config = parse_optimizer_config(c["optimizer"]);
    for (CpuIsa isa : supported_cpu_isas()) {
      INFO("case " << c["name"].get<std::string>() << ", isa " << cpu_isa_name(isa));
      std::vector<float> param = floats(c["param"]);
      std::vector<float> m(param.size(), 0.0f), v(param.size(), 0.0f);
      const CpuAdam adam(config.adam, CpuAdamOptions{isa, 1});
      const auto lrs = c["lr"].get<std::vector<double>>();
      for (std::size_t t = 0; t < lrs.size(); ++t) {
        const std::vector<float> grad = floats(c["grads"][t]);
        AdamSlice s;
        s.param = param.data();
        s.grad = grad.data();
        s.exp_avg = m.data();
        s.exp_avg_sq = v.data();
        s.numel = static_cast<std::int64_t>(param.size());
        adam.step(&s, 1, static_cast<std::int64_t>(t + 1), lrs[t]);
      }
      // The same update as torch up to rounding (adam.h: our fp32 forms of the decay and the
      // moment updates are the more accurate ones; torch's CPU add with alpha uses FMA): equal
      // to a few ulp, per tensor and per element.
      const std::pair<const char*, std::pair<const std::vector<float>*, std::vector<float>>>
          tensors[] = {{"param", {&param, floats(c["expected"]["param"])}},
                       {"exp_avg", {&m, floats(c["expected"]["exp_avg"])}},
                       {"exp_avg_sq", {&v, floats(c["expected"]["exp_avg_sq"])}}};
      for (const auto& [name, pair] : tensors) {
        const std::vector<float>& got = *pair.first;
        const std::vector<float>& want = pair.second;
        double diff = 0, norm = 0, scale = 0, worst = 0;
        for (std::size_t i = 0; i < got.size(); ++i) {
          diff += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
          norm += double(want[i]) * want[i];
          scale = std::max(scale, std::fabs(double(want[i])));
        }
        for (std::size_t i = 0; i < got.size(); ++i) {
          worst = std::max(worst, std::fabs(double(got[i]) - want[i]) / scale);
        }
        INFO(name);
        CHECK(std::sqrt(diff / norm) <= 1e-6);
        CHECK(worst <= 1e-6);  // each element, relative to the tensor's largest magnitude
        if (isa == CpuIsa::kScalar) {
          std::printf("  torch %-18s %-10s rel L2 %.2e  max |diff|/max|x| %.2e\n",
                      c["name"].get<std::string>().c_str(), name, std::sqrt(diff / norm), worst);
        }
      }
    }
  }
}

TEST_CASE("weight decay applies only to slices flagged for it", "[cpu_adam]") {
  AdamOptions decayed;
  decayed.weight_decay = 0.1;
  const AdamOptions none;  // wd 0
  for (bool adam_w_mode : {true, false}) {
    decayed.adam_w_mode = adam_w_mode;
    AdamProblem a(test::default_slice_sizes(), DType::kFloat32, false, DType::kBFloat16, 5);
    AdamProblem b(test::default_slice_sizes(), DType::kFloat32, false, DType::kBFloat16, 5);
    for (std::int64_t t = 1; t <= 5; ++t) {
      a.make_grads(t, 1);
      b.make_grads(t, 1);
      CpuAdam(decayed).step(a.slices(), t, 1e-2);
      CpuAdam(none).step(b.slices(), t, 1e-2);
    }
    for (std::size_t k = 0; k < a.sizes.size(); ++k) {
      INFO("adam_w_mode " << adam_w_mode << ", slice " << k << " decay " << a.decay[k]);
      const std::size_t o = static_cast<std::size_t>(a.offsets[k]);
      const bool same = std::memcmp(&a.param[o], &b.param[o], a.sizes[k] * sizeof(float)) == 0;
      CHECK(same == !a.decay[k]);
    }
  }
}

TEST_CASE("grad_scale multiplies the gradients inside the pass", "[cpu_adam]") {
  // A power-of-two scale is exact: scaling inside equals pre-scaled gradients bit for bit.
  AdamOptions options;
  options.weight_decay = 0.01;
  for (CpuIsa isa : supported_cpu_isas()) {
    INFO("isa " << cpu_isa_name(isa));
    AdamProblem inside(test::default_slice_sizes(), DType::kFloat32, true, DType::kBFloat16, 8);
    AdamProblem outside(test::default_slice_sizes(), DType::kFloat32, true, DType::kBFloat16, 8);
    const CpuAdam adam(options, CpuAdamOptions{isa, 2});
    for (std::int64_t t = 1; t <= 3; ++t) {
      inside.make_grads(t, 6);
      outside.make_grads(t, 6);
      auto* g = reinterpret_cast<float*>(outside.grad.data());
      outside.for_each_element([&](std::size_t i) { g[i] *= 0.125f; });
      adam.step(inside.slices(), t, 1e-3, 0.125);
      adam.step(outside.slices(), t, 1e-3);
    }
    CHECK(same_bits(inside.param, outside.param));
    CHECK(same_bits(inside.exp_avg, outside.exp_avg));
    CHECK(inside.out == outside.out);
  }
  const CpuAdam adam(options);
  AdamProblem p({4}, DType::kFloat32, false, DType::kBFloat16, 1);
  CHECK_THROWS_AS(adam.step(p.slices(), 1, 1e-3, -1.0), InvalidArgument);
  CHECK_THROWS_AS(adam.step(p.slices(), 1, 1e-3, INFINITY), InvalidArgument);
}

TEST_CASE("CpuAdam rejects malformed slices before touching memory", "[cpu_adam]") {
  AdamProblem p({8, 8}, DType::kFloat32, false, DType::kBFloat16, 1);
  const std::vector<float> before = p.param;
  const CpuAdam adam(AdamOptions{});
  auto slices = p.slices();
  CHECK_THROWS_AS(adam.step(slices, 0, 1e-3), Error);

  auto bad = slices;
  bad[1].grad = nullptr;
  CHECK_THROWS_WITH(adam.step(bad, 1, 1e-3), Catch::Contains("slice 1"));
  bad = slices;
  bad[1].grad_dtype = DType::kInt32;
  CHECK_THROWS_AS(adam.step(bad, 1, 1e-3), InvalidArgument);
  bad = slices;
  bad[0].param_out = p.out.data();
  bad[0].out_dtype = DType::kInt64;
  CHECK_THROWS_AS(adam.step(bad, 1, 1e-3), InvalidArgument);
  bad = slices;
  bad[0].numel = -1;
  CHECK_THROWS_AS(adam.step(bad, 1, 1e-3), InvalidArgument);
  CHECK(p.param == before);

  // Empty slices (and an empty list) are fine.
  bad = slices;
  bad[0] = AdamSlice{};
  CHECK_NOTHROW(adam.step(bad, 1, 1e-3));
  CHECK_NOTHROW(adam.step(nullptr, 0, 1, 1e-3));
}

TEST_CASE("DeviceAdam on the CPU backend is stream-ordered and equals CpuAdam", "[cpu_adam]") {
  auto device = make_device(DeviceOptions{});
  auto stream = device->create_stream("optimizer");
  AdamOptions options;
  options.weight_decay = 0.01;
  auto device_adam = make_device_adam(*device, options);
  AdamProblem host(test::default_slice_sizes(), DType::kBFloat16, true, DType::kBFloat16, 9);
  const std::int64_t n = host.total;
  auto alloc = [&](std::size_t bytes, MemCategory cat) {
    return device->allocate(static_cast<std::int64_t>(bytes), cat, "adam test");
  };
  Buffer param = alloc(n * 4, MemCategory::kMaster), m = alloc(n * 4, MemCategory::kOptimizer);
  Buffer v = alloc(n * 4, MemCategory::kOptimizer), grad = alloc(n * 2, MemCategory::kGrads);
  Buffer out = alloc(n * 2, MemCategory::kParams);
  auto upload = [&](const Buffer& b, const void* src, std::size_t bytes) {
    device->copy_to_device(b.device<std::byte>(), src, bytes, *stream);
  };
  upload(param, host.param.data(), n * 4);
  upload(m, host.exp_avg.data(), n * 4);
  upload(v, host.exp_avg_sq.data(), n * 4);
  upload(out, host.out.data(), n * 2);
  std::vector<AdamDeviceSlice> slices;
  for (std::size_t k = 0; k < host.sizes.size(); ++k) {
    const std::int64_t o = host.offsets[k];
    AdamDeviceSlice s;
    s.param = param.device<float>() + o;
    s.grad = grad.device<std::byte>() + o * 2;
    s.exp_avg = m.device<float>() + o;
    s.exp_avg_sq = v.device<float>() + o;
    s.param_out = out.device<std::byte>() + o * 2;
    s.numel = host.sizes[k];
    s.grad_dtype = DType::kBFloat16;
    s.out_dtype = DType::kBFloat16;
    s.weight_decay = host.decay[k];
    slices.push_back(s);
  }
  const CpuAdam reference(options);
  for (std::int64_t t = 1; t <= 4; ++t) {
    host.make_grads(t, 2);
    upload(grad, host.grad.data(), n * 2);
    device_adam->step(slices, t, 1e-3, *stream);
    stream->synchronize();  // the host gradient buffer is rewritten next iteration
    reference.step(host.slices(), t, 1e-3);
  }
  std::vector<float> got_param(n), got_m(n), got_v(n);
  std::vector<std::uint8_t> got_out(n * 2);
  device->copy_to_host(got_param.data(), param.device<const std::byte>(), n * 4, *stream);
  device->copy_to_host(got_m.data(), m.device<const std::byte>(), n * 4, *stream);
  device->copy_to_host(got_v.data(), v.device<const std::byte>(), n * 4, *stream);
  device->copy_to_host(got_out.data(), out.device<const std::byte>(), n * 2, *stream);
  stream->synchronize();
  CHECK(same_bits(got_param, host.param));
  CHECK(same_bits(got_m, host.exp_avg));
  CHECK(same_bits(got_v, host.exp_avg_sq));
  CHECK(got_out == host.out);

  std::vector<AdamDeviceSlice> broken = slices;
  broken[0].grad = DevicePtr<const std::byte>();
  CHECK_THROWS_AS(device_adam->step(broken, 5, 1e-3, *stream), InvalidArgument);
  CHECK_THROWS_AS(device_adam->step(slices, 0, 1e-3, *stream), Error);
}

}  // namespace
}  // namespace zrt
