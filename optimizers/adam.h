// Adam/AdamW on flat fp32 slices: the slice descriptors the engine hands to an optimizer, the
// per-step scalars, and the one element update every implementation (scalar, AVX2, AVX-512,
// CUDA) performs with the same operations in the same order. Built with -ffp-contract=off
// (CUDA: --fmad=false) and IEEE division and square root, so all of them give the same bits.
//
// The element update for step t (1-based) with learning rate lr, on fp32 values:
//   g = grad * grad_scale (bf16/fp16 widened exactly; grad_scale folds in loss-scale and clipping)
//   Adam (L2, adam_w_mode false):  g = g + wd*p
//   m = m + (1-b1)*(g - m)                                 (= b1*m + (1-b1)*g)
//   v = v + (1-b2)*(g*g - v)                               (= b2*v + (1-b2)*g*g)
//   denom = sqrt(v) + eps*sqrt(1 - b2^t)                  (scalars in float64, then fp32)
//   update = (lr*sqrt(1 - b2^t)/(1 - b1^t) * m) / denom    (= lr/(1-b1^t) * m /
//                                                             (sqrt(v)/sqrt(1-b2^t) + eps))
//   AdamW (decoupled):             update = update + (lr*wd)*p
//   p = p - update                                         (= p*(1-lr*wd) - update)
//   out = round_to_nearest_even(p) in the compute dtype (optional)
// Without bias correction the two (1 - b^t) factors are 1. This is DeepSpeed's and
// torch.optim.AdamW's update (decay of the old p, then the Adam step); the forms differ from
// torch 1.13's p.mul_(1-lr*wd), m*b1+(1-b1)*g and v*b2+(1-b2)*g*g only in rounding, chosen
// because they are markedly more accurate in fp32: b1, b2 and 1-lr*wd rounded to fp32 are off by
// up to 6e-8 relative (0.999f, 1-1e-5), a bias that compounds over the EMA window (about
// 1/(1-b2) steps for v) and over every step for p, whereas fp32 (1-b) and lr*wd carry their
// rounding as a relative error of a small term; p is rounded once per step, not twice; and
// folding sqrt(1-b2^t) into the two scalars leaves one division and one square root per
// element, which keeps the vector kernels memory-bound.
// Results differ from torch by a few ulp (tests/golden); against a float64 reference they stay
// within 1e-6 relative (tests/optimizers/test_cpu_adam.cc).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "optimizers/adam_math.h"
#include "optimizers/optimizer_slices.h"
#include "runtime/common/dtype.h"
#include "runtime/device/device_ptr.h"

namespace zrt {

struct AdamOptions;

// One contiguous run of elements updated in place, in host memory (for the CPU optimizer: on
// the CPU backend device memory is host memory, unwrapped with device_access::raw; with offload
// it is pinned host memory). The engine passes the rank's owned part of a unit, split at
// parameter boundaries where the weight decay changes. Slices must not overlap.
struct AdamSlice {
  float* param = nullptr;       // fp32 master weights, numel elements
  const void* grad = nullptr;   // numel gradients of grad_dtype
  float* exp_avg = nullptr;     // first moment m, numel elements (zero before step 1)
  float* exp_avg_sq = nullptr;  // second moment v, numel elements (zero before step 1)
  void* param_out = nullptr;    // optional: receives the updated param in out_dtype
  std::int64_t numel = 0;
  DType grad_dtype = DType::kFloat32;  // fp32, bf16 or fp16
  DType out_dtype = DType::kBFloat16;  // bf16, fp16 or fp32; used only with param_out
  bool weight_decay = true;            // false: no weight decay here (biases, norm weights)
};

// The same in device memory, for the CUDA optimizer (and the stream-ordered DeviceAdam).
struct AdamDeviceSlice {
  DevicePtr<float> param;
  DevicePtr<const std::byte> grad;
  DevicePtr<float> exp_avg;
  DevicePtr<float> exp_avg_sq;
  DevicePtr<std::byte> param_out;  // null: no compute-dtype copy
  std::int64_t numel = 0;
  DType grad_dtype = DType::kFloat32;
  DType out_dtype = DType::kBFloat16;
  bool weight_decay = true;
};

// The shared code's view of the two (optimizer_slices.h): the states in spec order.
struct AdamSliceFamily {
  static constexpr const char* kFamily = "Adam";
  static constexpr std::array<const char*, 2> kStateNames{"exp_avg", "exp_avg_sq"};
};
template <>
struct SliceTraits<AdamSlice> : AdamSliceFamily {
  static constexpr std::array kStates{&AdamSlice::exp_avg, &AdamSlice::exp_avg_sq};
};
template <>
struct SliceTraits<AdamDeviceSlice> : AdamSliceFamily {
  static constexpr std::array kStates{&AdamDeviceSlice::exp_avg, &AdamDeviceSlice::exp_avg_sq};
};

// step: 1-based Adam step (drives the bias correction); lr: this step's learning rate;
// grad_scale: finite, >= 0. Throws for step < 1 or a bad grad_scale.
AdamStepScalars adam_step_scalars(const AdamOptions& options, std::int64_t step, double lr,
                                  double grad_scale = 1.0);

}  // namespace zrt
