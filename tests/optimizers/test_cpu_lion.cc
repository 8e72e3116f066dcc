// CpuLion against a float64 Lion written here, separately from the implementation, over several
// steps (sign ties c == 0, weight decay, exempt slices, bf16/fp16 gradients, grad_scale), on
// every ISA the machine has; bit-identical results across ISAs and thread counts; slice
// validation; the "Lion" config block and the optimizer spec.
//
// Tolerance: m and c never depend on p, so the fp32 momentum stays within rounding of the
// float64 one whatever p does. With u = 2^-24 and G the largest |g| or |m| an element has seen:
// one step rounds g*scale, g - m, the product with fp32 (1-b) (itself within u of 1-b) and the
// sum, at most 4uG; earlier errors are multiplied by b2 < 1, so after t steps
// |m - m64| <= 4uG * min(t, 1/(1-b2)) =: E_m(t), and c (one more such step, b1) is within
// band(t) = E_m(t) + 4uG of c64. sign(c) can differ from sign(c64) only where |c64| <= band(t):
// such a step is a "near tie", and it may move p by up to 2*lr (+lr against -lr). Elsewhere p
// carries only its own rounding: per step the fp32 lr and lr*wd (within u), lr*wd*p, the sum and
// the difference, at most 4u(|p| + lr), summed over the steps (E_p). So each element must satisfy
// |p - p64| <= E_p + 2*lr*(its near ties), and every element beyond E_p must have a near tie:
// the test counts both and prints them.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "optimizers/cpu_lion.h"
#include "optimizers/optimizer.h"
#include "optimizers/optimizer_config.h"
#include "runtime/common/error.h"

namespace zrt {
namespace {

constexpr double kU = 1.0 / (1 << 24);  // fp32 unit roundoff

// Contiguous slices of the given sizes in one array; every third slice is exempt from decay.
struct LionProblem {
  std::vector<std::int64_t> sizes;
  std::vector<float> param, exp_avg;
  std::vector<std::uint16_t> grad16;  // bf16 or fp16 gradients
  std::vector<float> grad32;          // the gradients exactly as the kernel reads them
  DType grad_dtype;
  std::vector<std::uint16_t> out;  // bf16 copy of the params

  LionProblem(std::vector<std::int64_t> slice_sizes, DType gtype)
      : sizes(std::move(slice_sizes)), grad_dtype(gtype) {
    std::int64_t n = 0;
    for (std::int64_t s : sizes) n += s;
    param.resize(static_cast<std::size_t>(n));
    exp_avg.assign(param.size(), 0.0f);
    grad32.resize(param.size());
    grad16.resize(param.size());
    out.resize(param.size());
    std::mt19937_64 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& p : param) p = 0.1f * normal(rng);
  }
  std::int64_t total() const { return static_cast<std::int64_t>(param.size()); }
  bool decays(std::size_t slice) const { return slice % 3 != 1; }

  void new_gradients(std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (std::size_t i = 0; i < param.size(); ++i) {
      float g = normal(rng);
      if (i % 97 == 0) g = 0.0f;  // zero gradients: c == 0 at step 1
      if (grad_dtype == DType::kBFloat16) {
        grad16[i] = to_bf16(g).bits;
        grad32[i] = to_float(bf16{grad16[i]});
      } else if (grad_dtype == DType::kFloat16) {
        grad16[i] = to_fp16(g).bits;
        grad32[i] = to_float(fp16{grad16[i]});
      } else {
        grad32[i] = g;
      }
    }
  }

  std::vector<LionSlice> slices() {
    std::vector<LionSlice> out_slices;
    std::int64_t offset = 0;
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      LionSlice s;
      const auto o = static_cast<std::size_t>(offset);
      s.param = param.data() + o;
      s.exp_avg = exp_avg.data() + o;
      s.grad = grad_dtype == DType::kFloat32 ? static_cast<const void*>(grad32.data() + o)
                                             : static_cast<const void*>(grad16.data() + o);
      s.grad_dtype = grad_dtype;
      s.param_out = out.data() + o;
      s.out_dtype = DType::kBFloat16;
      s.numel = sizes[k];
      s.weight_decay = decays(k);
      out_slices.push_back(s);
      offset += sizes[k];
    }
    return out_slices;
  }
};

// The float64 Lion of the paper (Algorithm 2): decay the weight, step by lr*sign(c), then
// update the momentum.
struct ReferenceLion {
  double beta1, beta2, wd;
  void step(double& p, double& m, double g, double lr, bool decay) const {
    const double c = beta1 * m + (1.0 - beta1) * g;
    const double sign = c > 0 ? 1.0 : (c < 0 ? -1.0 : 0.0);
    if (decay) p *= 1.0 - lr * wd;
    p -= lr * sign;
    m = beta2 * m + (1.0 - beta2) * g;
  }
};

struct Case {
  const char* name;
  LionOptions options;
  DType grad_dtype;
  double grad_scale;
};

TEST_CASE("CpuLion matches a float64 Lion over several steps on every ISA", "[lion]") {
  LionOptions wd;
  wd.weight_decay = 0.1;
  LionOptions plain;
  LionOptions fast = wd;
  fast.beta1 = 0.5;
  fast.beta2 = 0.9;
  const Case cases[] = {
      {"fp32 grads, wd 0.1", wd, DType::kFloat32, 1.0},
      {"bf16 grads, no wd", plain, DType::kBFloat16, 1.0},
      {"fp16 grads, betas (0.5, 0.9), grad_scale 1/1536", fast, DType::kFloat16, 1.0 / 1536},
  };
  constexpr int kSteps = 12;
  for (const Case& c : cases) {
    for (CpuIsa isa : supported_cpu_isas()) {
      INFO(c.name << " on " << cpu_isa_name(isa));
      LionProblem prob({1, 7, 16, 33, 100, 1027, 4099}, c.grad_dtype);
      const std::size_t n = prob.param.size();
      std::vector<double> p64(prob.param.begin(), prob.param.end()), m64(n, 0.0);
      std::vector<double> gmax(n, 0.0), e_p(n, 0.0);
      std::vector<int> near_ties(n, 0);
      std::vector<int> slice_of(n);
      for (std::size_t k = 0, i = 0; k < prob.sizes.size(); ++k) {
        for (std::int64_t j = 0; j < prob.sizes[k]; ++j) slice_of[i++] = static_cast<int>(k);
      }
      CpuAdamOptions cpu;
      cpu.isa = isa;
      const CpuLion lion(c.options, cpu);
      const ReferenceLion ref{c.options.beta1, c.options.beta2, c.options.weight_decay};
      std::int64_t ties_seen = 0;
      for (int t = 1; t <= kSteps; ++t) {
        const double lr = 1e-3 * (1.0 + 0.1 * t);
        prob.new_gradients(100 + t);
        std::vector<LionSlice> slices = prob.slices();
        lion.step(slices, lr, c.grad_scale);
        const double e_m_steps = std::min<double>(t, 1.0 / (1.0 - c.options.beta2));
        for (std::size_t i = 0; i < n; ++i) {
          const double g = static_cast<double>(prob.grad32[i]) * c.grad_scale;
          gmax[i] = std::max({gmax[i], std::fabs(g), std::fabs(m64[i])});
          const double band = 4 * kU * gmax[i] * (e_m_steps + 1);
          const double c64 = c.options.beta1 * m64[i] + (1 - c.options.beta1) * g;
          if (c64 == 0) ++ties_seen;
          if (std::fabs(c64) <= band) ++near_ties[i];
          const bool decay = c.options.weight_decay > 0 && prob.decays(slice_of[i]);
          ref.step(p64[i], m64[i], g, lr, decay);
          e_p[i] += 4 * kU * (std::fabs(p64[i]) + lr);
        }
        // The momentum never depends on p: check it every step.
        std::size_t bad_m = 0;
        for (std::size_t i = 0; i < n; ++i) {
          const double e_m = 4 * kU * gmax[i] * e_m_steps + 1e-45;
          if (!(std::fabs(prob.exp_avg[i] - m64[i]) <= e_m)) ++bad_m;
        }
        REQUIRE(bad_m == 0);
      }
      std::size_t beyond_rounding = 0, unexplained = 0, with_near_ties = 0;
      double worst_rounding_ratio = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const double diff = std::fabs(prob.param[i] - p64[i]);
        if (near_ties[i] > 0) ++with_near_ties;
        if (diff > e_p[i]) {
          ++beyond_rounding;
          const double lr_max = 1e-3 * (1.0 + 0.1 * kSteps);
          if (near_ties[i] == 0 || diff > e_p[i] + 2 * lr_max * near_ties[i]) ++unexplained;
        } else {
          worst_rounding_ratio = std::max(worst_rounding_ratio, diff / e_p[i]);
        }
        // The bf16 copy is the rounding of the master weight.
        REQUIRE(prob.out[i] == to_bf16(prob.param[i]).bits);
      }
      UNSCOPED_INFO("");
      WARN(c.name << " " << cpu_isa_name(isa) << ": " << n << " elements x " << kSteps
                  << " steps, exact ties c64 == 0: " << ties_seen << ", elements with near ties: "
                  << with_near_ties << ", sign flips (beyond rounding): " << beyond_rounding
                  << ", worst |p - p64| / E_p elsewhere: " << worst_rounding_ratio);
      CHECK(ties_seen > 0);
      CHECK(unexplained == 0);
    }
  }
}

TEST_CASE("CpuLion: exact sign ties leave only the weight decay", "[lion]") {
  // With b1 = 0.5 and m = -g, c = m + 0.5*(g - m) = m + 0.5*(-2m) = 0 exactly in fp32: p must
  // change by the decay alone and m must still move towards g.
  LionOptions o;
  o.beta1 = 0.5;
  o.weight_decay = 0.2;
  const double lr = 0.01;
  for (CpuIsa isa : supported_cpu_isas()) {
    INFO(cpu_isa_name(isa));
    constexpr std::int64_t kN = 37;  // vector bodies and a scalar tail
    std::vector<float> p(kN), m(kN), g(kN);
    for (std::int64_t i = 0; i < kN; ++i) {
      p[i] = 0.25f + 0.01f * static_cast<float>(i);
      g[i] = (i % 2 ? 1.0f : -1.0f) * 0.125f * static_cast<float>(i % 5);  // includes g == 0
      m[i] = -g[i];
    }
    const std::vector<float> p0 = p, m0 = m;
    LionSlice s;
    s.param = p.data();
    s.exp_avg = m.data();
    s.grad = g.data();
    s.numel = kN;
    CpuAdamOptions cpu;
    cpu.isa = isa;
    CpuLion(o, cpu).step(&s, 1, lr);
    const float lr_wd = static_cast<float>(lr * o.weight_decay);
    const float one_minus_beta2 = static_cast<float>(1.0 - o.beta2);
    for (std::int64_t i = 0; i < kN; ++i) {
      CHECK(p[i] == p0[i] - lr_wd * p0[i]);  // no sign step at all
      CHECK(std::fabs(p[i] - p0[i] * (1.0 - lr * o.weight_decay)) <= 2 * kU * p0[i]);
      CHECK(m[i] == m0[i] + one_minus_beta2 * (g[i] - m0[i]));
    }
  }
}

TEST_CASE("CpuLion is bit-identical across ISAs and thread counts", "[lion]") {
  LionOptions o;
  o.weight_decay = 0.05;
  auto run = [&](CpuIsa isa, int threads) {
    LionProblem prob({3, 70001, 129, 65536, 17}, DType::kBFloat16);
    CpuAdamOptions cpu;
    cpu.isa = isa;
    cpu.num_threads = threads;
    const CpuLion lion(o, cpu);
    for (int t = 1; t <= 3; ++t) {
      prob.new_gradients(t);
      std::vector<LionSlice> slices = prob.slices();
      lion.step(slices, 1e-3 * t, 0.5);
    }
    return prob;
  };
  const LionProblem base = run(CpuIsa::kScalar, 1);
  for (CpuIsa isa : supported_cpu_isas()) {
    for (int threads : {1, 2, 3}) {
      INFO(cpu_isa_name(isa) << " x " << threads << " threads");
      const LionProblem other = run(isa, threads);
      CHECK(std::memcmp(other.param.data(), base.param.data(), base.param.size() * 4) == 0);
      CHECK(std::memcmp(other.exp_avg.data(), base.exp_avg.data(), base.param.size() * 4) == 0);
      CHECK(other.out == base.out);
    }
  }
}

TEST_CASE("CpuLion validates its slices and scalars", "[lion]") {
  std::vector<float> p(4), g(4);
  LionSlice s;
  s.param = p.data();
  s.grad = g.data();
  s.numel = 4;
  const CpuLion lion(LionOptions{});
  CHECK_THROWS_WITH(lion.step(&s, 1, 1e-3), Catch::Contains("null param, grad or exp_avg"));
  std::vector<float> m(4);
  s.exp_avg = m.data();
  CHECK_THROWS_WITH(lion.step(&s, 1, 1e-3, std::nan("")), Catch::Contains("grad_scale"));
  s.grad_dtype = DType::kInt32;
  CHECK_THROWS_WITH(lion.step(&s, 1, 1e-3), Catch::Contains("gradient dtype"));
}

TEST_CASE("optimizer config: Lion", "[lion][config]") {
  using nlohmann::json;
  const OptimizerConfig c = parse_optimizer_config(
      json::parse(R"({"type": "lion", "params": {"lr": 1e-4, "weight_decay": 0.5}})"));
  CHECK(c.type == "Lion");
  CHECK(c.is_lion());
  CHECK(c.lr() == 1e-4);
  CHECK(c.lion.beta1 == 0.9);
  CHECK(c.lion.beta2 == 0.99);
  CHECK(c.lion.weight_decay == 0.5);
  // Adam's keys are not Lion's: listed as unknown with the valid ones.
  CHECK_THROWS_WITH(
      parse_optimizer_config(json::parse(R"({"type": "Lion", "params": {"eps": 1e-8}})")),
      Catch::Contains("unknown key 'eps' in optimizer.params") &&
          Catch::Contains("valid keys: lr, betas, weight_decay"));
  CHECK_THROWS_WITH(
      parse_optimizer_config(json::parse(R"({"type": "Lion", "params": {"betas": [0.9, 1.5]}})")),
      Catch::Contains("betas must lie in [0, 1)"));

  const OptimizerSpec lion = optimizer_spec(c);
  CHECK(lion.family == "Lion");
  CHECK(lion.state_names == std::vector<std::string>{"exp_avg"});
  CHECK(lion.state_bytes_per_parameter() == 8);
  const OptimizerSpec adam = optimizer_spec(OptimizerConfig{});
  CHECK(adam.family == "Adam");
  CHECK(adam.state_names == std::vector<std::string>{"exp_avg", "exp_avg_sq"});
  CHECK(adam.state_bytes_per_parameter() == 12);
  CHECK(adam.state_index("exp_avg_sq") == 1);
  CHECK(lion.state_index("exp_avg_sq") == -1);
}

}  // namespace
}  // namespace zrt
