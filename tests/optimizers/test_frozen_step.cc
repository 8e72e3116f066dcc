// What the engine's frozen parameters rely on (runtime/model_interface.h, ParamSpec::frozen):
// an Adam or Lion step over a slice whose gradient is zero, whose state is zero and which takes
// no weight decay leaves the fp32 parameter and the state exactly as they were, and writes the
// compute-dtype copy of the unchanged parameter. On every ISA path this machine runs, at every
// gradient and output dtype, with a loss scale's grad_scale, over lengths with vector tails and
// one long enough for several threads; the parameters include signed zeros, subnormals and
// values near the dtypes' limits.
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include "optimizers/cpu_adam.h"
#include "optimizers/cpu_lion.h"
#include "runtime/common/cpu_isa.h"
#include "runtime/common/dtype.h"

namespace zrt {
namespace frozen_step_test {

std::vector<float> awkward_parameters(std::int64_t n) {
  const float specials[] = {0.0f, -0.0f, 1e-40f, -1e-40f, 3.0e38f, -65504.0f, 1.0f, -2.5e-3f};
  std::vector<float> p(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    p[static_cast<std::size_t>(i)] =
        i % 3 == 0 ? specials[(i / 3) % 8] : 0.02f * static_cast<float>((i * 7919) % 201 - 100);
  }
  return p;
}

std::vector<std::byte> compute_copy(const std::vector<float>& p, DType type) {
  std::vector<std::byte> out(p.size() * dtype_size(type));
  for (std::size_t i = 0; i < p.size(); ++i) {
    if (type == DType::kBFloat16) {
      const bf16 h = to_bf16(p[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    } else if (type == DType::kFloat16) {
      const fp16 h = to_fp16(p[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    } else {
      std::memcpy(out.data() + 4 * i, &p[i], 4);
    }
  }
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

struct FrozenCase {
  DType grad;
  DType out;
  double grad_scale;
};

const FrozenCase kCases[] = {{DType::kFloat32, DType::kBFloat16, 1.0},
                             {DType::kBFloat16, DType::kBFloat16, 1.0},
                             {DType::kFloat16, DType::kFloat16, 1.0 / 4096},
                             {DType::kFloat32, DType::kFloat32, 0.37}};
const std::int64_t kLengths[] = {1, 7, 16, 33, 1000, 200003};

std::vector<CpuIsa> isas() {
  std::vector<CpuIsa> out;
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (cpu_isa_supported(isa)) out.push_back(isa);
  }
  return out;
}

}  // namespace frozen_step_test

TEST_CASE("an Adam step on a frozen slice leaves the parameter and its moments untouched",
          "[frozen]") {
  for (CpuIsa isa : frozen_step_test::isas()) {
    for (const bool adam_w : {true, false}) {
      AdamOptions options;
      options.weight_decay = 0.1;
      options.adam_w_mode = adam_w;
      CpuAdamOptions cpu;
      cpu.isa = isa;
      const CpuAdam adam(options, cpu);
      for (const frozen_step_test::FrozenCase& c : frozen_step_test::kCases) {
        for (std::int64_t n : frozen_step_test::kLengths) {
          INFO(cpu_isa_name(isa) << (adam_w ? " AdamW" : " Adam L2") << " grad "
                                 << dtype_name(c.grad) << " out " << dtype_name(c.out) << " n "
                                 << n);
          const std::vector<float> initial = frozen_step_test::awkward_parameters(n);
          std::vector<float> param = initial, m(initial.size(), 0.0f), v(initial.size(), 0.0f);
          const std::vector<std::byte> grad(initial.size() * dtype_size(c.grad), std::byte{0});
          std::vector<std::byte> out(initial.size() * dtype_size(c.out), std::byte{0x5a});
          AdamSlice s;
          s.param = param.data();
          s.grad = grad.data();
          s.exp_avg = m.data();
          s.exp_avg_sq = v.data();
          s.param_out = out.data();
          s.numel = n;
          s.grad_dtype = c.grad;
          s.out_dtype = c.out;
          s.weight_decay = false;
          for (std::int64_t t = 1; t <= 3; ++t) adam.step(&s, 1, t, 1e-2, c.grad_scale);
          CHECK(frozen_step_test::same_bits(param, initial));
          CHECK(frozen_step_test::same_bits(m, std::vector<float>(initial.size(), 0.0f)));
          CHECK(frozen_step_test::same_bits(v, std::vector<float>(initial.size(), 0.0f)));
          CHECK(out == frozen_step_test::compute_copy(initial, c.out));
        }
      }
    }
  }
}

TEST_CASE("a Lion step on a frozen slice leaves the parameter and its momentum untouched",
          "[frozen]") {
  for (CpuIsa isa : frozen_step_test::isas()) {
    LionOptions options;
    options.weight_decay = 0.1;
    CpuAdamOptions cpu;
    cpu.isa = isa;
    const CpuLion lion(options, cpu);
    for (const frozen_step_test::FrozenCase& c : frozen_step_test::kCases) {
      for (std::int64_t n : frozen_step_test::kLengths) {
        INFO(cpu_isa_name(isa) << " grad " << dtype_name(c.grad) << " out " << dtype_name(c.out)
                               << " n " << n);
        const std::vector<float> initial = frozen_step_test::awkward_parameters(n);
        std::vector<float> param = initial, m(initial.size(), 0.0f);
        const std::vector<std::byte> grad(initial.size() * dtype_size(c.grad), std::byte{0});
        std::vector<std::byte> out(initial.size() * dtype_size(c.out), std::byte{0x5a});
        LionSlice s;
        s.param = param.data();
        s.grad = grad.data();
        s.exp_avg = m.data();
        s.param_out = out.data();
        s.numel = n;
        s.grad_dtype = c.grad;
        s.out_dtype = c.out;
        s.weight_decay = false;
        for (int t = 1; t <= 3; ++t) lion.step(&s, 1, 1e-2, c.grad_scale);
        CHECK(frozen_step_test::same_bits(param, initial));
        CHECK(frozen_step_test::same_bits(m, std::vector<float>(initial.size(), 0.0f)));
        CHECK(out == frozen_step_test::compute_copy(initial, c.out));
      }
    }
  }
}

}  // namespace zrt
