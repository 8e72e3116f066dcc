// Shared by the optimizer tests: a multi-slice Adam problem in host memory (with guard elements
// between slices), its gradients for each step, and a float64 scalar reference.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "optimizers/adam.h"
#include "optimizers/optimizer_config.h"
#include "runtime/common/dtype.h"

namespace zrt::test {

// Slice sizes that exercise vector bodies, scalar tails and tiny slices.
inline std::vector<std::int64_t> default_slice_sizes() {
  return {1, 5, 16, 31, 64, 257, 1000, 4099};
}

struct AdamProblem {
  static constexpr std::int64_t kGap = 3;  // guard elements between slices
  static constexpr float kGuard = 12345.0f;

  std::vector<std::int64_t> sizes;
  std::vector<std::int64_t> offsets;  // element offset of each slice
  std::vector<bool> decay;            // per-slice weight-decay flag
  std::int64_t total = 0;             // elements including guards
  DType grad_dtype = DType::kFloat32;
  bool with_out = false;
  DType out_dtype = DType::kBFloat16;

  std::vector<float> param, exp_avg, exp_avg_sq;
  std::vector<std::uint8_t> grad;  // total * dtype_size(grad_dtype) bytes
  std::vector<std::uint8_t> out;   // total * dtype_size(out_dtype) bytes
  std::vector<float> grad_f32;     // the gradients as fp32 (exactly what the kernels read)

  AdamProblem(std::vector<std::int64_t> slice_sizes, DType grad_type, bool out_enabled,
              DType out_type, std::uint64_t seed)
      : sizes(std::move(slice_sizes)),
        grad_dtype(grad_type),
        with_out(out_enabled),
        out_dtype(out_type) {
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      total += kGap;
      offsets.push_back(total);
      total += sizes[k];
      decay.push_back(k % 3 != 1);  // a mix of decayed and exempt slices
    }
    total += kGap;
    const std::size_t n = static_cast<std::size_t>(total);
    param.assign(n, kGuard);
    exp_avg.assign(n, kGuard);
    exp_avg_sq.assign(n, kGuard);
    grad.assign(n * dtype_size(grad_dtype), 0);
    out.assign(n * dtype_size(out_dtype), 0xab);
    grad_f32.assign(n, 0.0f);
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for_each_element([&](std::size_t i) {
      param[i] = normal(rng);
      exp_avg[i] = 0.0f;
      exp_avg_sq[i] = 0.0f;
    });
  }

  template <typename Fn>
  void for_each_element(Fn&& fn) const {
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      for (std::int64_t i = 0; i < sizes[k]; ++i) fn(static_cast<std::size_t>(offsets[k] + i));
    }
  }

  // Fills the gradients of `step` deterministically (scale varies per step; some exact zeros
  // and large values), in grad_dtype, and their fp32 values in grad_f32.
  void make_grads(std::int64_t step, std::uint64_t seed) {
    std::mt19937_64 rng(seed * 1000003u + static_cast<std::uint64_t>(step));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const float scale = 0.05f * static_cast<float>(1 + step % 7);
    for_each_element([&](std::size_t i) {
      float g = normal(rng) * scale;
      if (i % 97 == static_cast<std::size_t>(step) % 97) g = 0.0f;
      if (i % 211 == 5) g *= 50.0f;
      switch (grad_dtype) {
        case DType::kBFloat16: {
          const bf16 h = to_bf16(g);
          std::memcpy(&grad[i * 2], &h, 2);
          grad_f32[i] = to_float(h);
          break;
        }
        case DType::kFloat16: {
          const fp16 h = to_fp16(g);
          std::memcpy(&grad[i * 2], &h, 2);
          grad_f32[i] = to_float(h);
          break;
        }
        default:
          std::memcpy(&grad[i * 4], &g, 4);
          grad_f32[i] = g;
          break;
      }
    });
  }

  std::vector<AdamSlice> slices() {
    std::vector<AdamSlice> out_slices;
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      const std::size_t o = static_cast<std::size_t>(offsets[k]);
      AdamSlice s;
      s.param = param.data() + o;
      s.grad = grad.data() + o * dtype_size(grad_dtype);
      s.exp_avg = exp_avg.data() + o;
      s.exp_avg_sq = exp_avg_sq.data() + o;
      s.param_out = with_out ? out.data() + o * dtype_size(out_dtype) : nullptr;
      s.numel = sizes[k];
      s.grad_dtype = grad_dtype;
      s.out_dtype = out_dtype;
      s.weight_decay = decay[k];
      out_slices.push_back(s);
    }
    return out_slices;
  }

  // True iff every guard element is untouched.
  bool guards_intact() const {
    std::vector<bool> inside(static_cast<std::size_t>(total), false);
    for_each_element([&](std::size_t i) { inside[i] = true; });
    for (std::size_t i = 0; i < inside.size(); ++i) {
      if (inside[i]) continue;
      if (param[i] != kGuard || exp_avg[i] != kGuard || exp_avg_sq[i] != kGuard) return false;
    }
    return true;
  }
};

// float64 Adam/AdamW: the mathematical update the fp32 kernels approximate.
struct ReferenceAdam {
  std::vector<double> param, exp_avg, exp_avg_sq;

  explicit ReferenceAdam(const AdamProblem& problem)
      : param(problem.param.begin(), problem.param.end()),
        exp_avg(problem.param.size(), 0.0),
        exp_avg_sq(problem.param.size(), 0.0) {}

  void step(const AdamProblem& problem, const AdamOptions& o, std::int64_t t, double lr,
            double grad_scale = 1.0) {
    const double bc1 = o.bias_correction ? 1.0 - std::pow(o.beta1, static_cast<double>(t)) : 1.0;
    const double bc2 = o.bias_correction ? 1.0 - std::pow(o.beta2, static_cast<double>(t)) : 1.0;
    for (std::size_t k = 0; k < problem.sizes.size(); ++k) {
      const bool decay = problem.decay[k] && o.weight_decay > 0;
      for (std::int64_t e = 0; e < problem.sizes[k]; ++e) {
        const std::size_t i = static_cast<std::size_t>(problem.offsets[k] + e);
        double g = problem.grad_f32[i] * grad_scale;
        double& p = param[i];
        if (decay && !o.adam_w_mode) g += o.weight_decay * p;
        if (decay && o.adam_w_mode) p *= 1.0 - lr * o.weight_decay;
        exp_avg[i] = o.beta1 * exp_avg[i] + (1.0 - o.beta1) * g;
        exp_avg_sq[i] = o.beta2 * exp_avg_sq[i] + (1.0 - o.beta2) * g * g;
        const double denom = std::sqrt(exp_avg_sq[i]) / std::sqrt(bc2) + o.eps;
        p -= lr / bc1 * exp_avg[i] / denom;
      }
    }
  }
};

// ||a - b|| / ||b|| over slice k of the problem (0 if both are zero).
template <typename A, typename B>
double relative_l2(const AdamProblem& problem, std::size_t k, const std::vector<A>& a,
                   const std::vector<B>& b) {
  double diff = 0.0, norm = 0.0;
  for (std::int64_t e = 0; e < problem.sizes[k]; ++e) {
    const std::size_t i = static_cast<std::size_t>(problem.offsets[k] + e);
    const double x = static_cast<double>(a[i]);
    const double y = static_cast<double>(b[i]);
    diff += (x - y) * (x - y);
    norm += y * y;
  }
  if (norm == 0.0) return diff == 0.0 ? 0.0 : INFINITY;
  return std::sqrt(diff / norm);
}

}  // namespace zrt::test
