// Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"; DeepSpeed's "Lion")
// on flat fp32 slices: the slice descriptors, the per-step scalars and the one element update
// every implementation (scalar, AVX2, AVX-512, CUDA) performs with the same operations in the
// same order, so all of them give the same bits (built like Adam: -ffp-contract=off, CUDA
// --fmad=false).
//
// The element update with learning rate lr, on fp32 values:
//   g = grad * grad_scale (bf16/fp16 widened exactly; grad_scale folds in loss-scale and clipping)
//   c = m + (1-b1)*(g - m)                 (= b1*m + (1-b1)*g: the update direction)
//   update = lr*sign(c)                    (exactly +lr, -lr, or 0 where c == 0, as torch.sign)
//   with weight decay: update = update + (lr*wd)*p
//   p = p - update                         (= p*(1 - lr*wd) - lr*sign(c))
//   m = m + (1-b2)*(g - m)                 (= b2*m + (1-b2)*g: the momentum kept)
//   out = round_to_nearest_even(p) in the compute dtype (optional)
// Order: the paper's Algorithm 2, Google's and DeepSpeed's implementations decay the old weight
// first (p *= 1 - lr*wd), then subtract lr*sign(c) computed from the old m, then update m; the
// form above decays the same old p and is that update in one rounding of p, not two. As for
// Adam (adam.h), (1-b) is applied to a difference so that b rounded to fp32 leaves no bias in
// the moving average. Lion has no step count and no bias correction: its state is m alone, so 8
// bytes per parameter (master + m) against Adam's 12.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "optimizers/lion_math.h"
#include "optimizers/optimizer_slices.h"
#include "runtime/common/dtype.h"
#include "runtime/device/device_ptr.h"

namespace zrt {

struct LionOptions;

// One contiguous run of elements updated in place, in host memory (as AdamSlice).
struct LionSlice {
  float* param = nullptr;      // fp32 master weights, numel elements
  const void* grad = nullptr;  // numel gradients of grad_dtype
  float* exp_avg = nullptr;    // momentum m, numel elements (zero before step 1)
  void* param_out = nullptr;   // optional: receives the updated param in out_dtype
  std::int64_t numel = 0;
  DType grad_dtype = DType::kFloat32;  // fp32, bf16 or fp16
  DType out_dtype = DType::kBFloat16;  // bf16, fp16 or fp32; used only with param_out
  bool weight_decay = true;            // false: no weight decay here (biases, norm weights)
};

// The same in device memory, for the CUDA optimizer.
struct LionDeviceSlice {
  DevicePtr<float> param;
  DevicePtr<const std::byte> grad;
  DevicePtr<float> exp_avg;
  DevicePtr<std::byte> param_out;  // null: no compute-dtype copy
  std::int64_t numel = 0;
  DType grad_dtype = DType::kFloat32;
  DType out_dtype = DType::kBFloat16;
  bool weight_decay = true;
};

// The shared code's view of the two (optimizer_slices.h): the states in spec order.
struct LionSliceFamily {
  static constexpr const char* kFamily = "Lion";
  static constexpr std::array<const char*, 1> kStateNames{"exp_avg"};
};
template <>
struct SliceTraits<LionSlice> : LionSliceFamily {
  static constexpr std::array kStates{&LionSlice::exp_avg};
};
template <>
struct SliceTraits<LionDeviceSlice> : LionSliceFamily {
  static constexpr std::array kStates{&LionDeviceSlice::exp_avg};
};

// lr: this step's learning rate; grad_scale: finite, >= 0. Throws InvalidArgument otherwise.
LionStepScalars lion_step_scalars(const LionOptions& options, double lr, double grad_scale = 1.0);

}  // namespace zrt
