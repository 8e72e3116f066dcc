#include "kernels/cuda/gelu.cuh"

#include "kernels/cuda/device_math.cuh"
#include "runtime/device/cuda_device.h"

namespace zrt::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr float kScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kCubic = 0.044715f;

template <typename S>
__global__ void gelu_forward_kernel(S* out, const S* inp, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float x = ld(inp[i]);
    const float u = kScale * (x + kCubic * x * x * x);
    out[i] = st<S>(0.5f * x * (1.0f + tanhf(u)));
  }
}

template <typename S>
__global__ void gelu_backward_kernel(S* dinp, const S* inp, const S* dout, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float x = ld(inp[i]);
    const float u = kScale * (x + kCubic * x * x * x);
    const float th = tanhf(u);
    const float local =
        0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * kScale * (1.0f + 3.0f * kCubic * x * x);
    dinp[i] = st<S>(ld(dinp[i]) + local * ld(dout[i]));
  }
}

}  // namespace

void gelu_forward(const Launch& l, DType dtype, void* out, const void* inp, std::int64_t n) {
  with_storage(dtype, [&](auto s) {
    using S = typename decltype(s)::type;
    gelu_forward_kernel<S><<<blocks_for(n, kThreads), kThreads, 0, l.stream>>>(
        static_cast<S*>(out), static_cast<const S*>(inp), n);
    ZRT_CUDA_LAUNCH_CHECK();
  });
}

void gelu_backward(const Launch& l, DType dtype, void* dinp, const void* inp, const void* dout,
                   std::int64_t n) {
  with_storage(dtype, [&](auto s) {
    using S = typename decltype(s)::type;
    gelu_backward_kernel<S><<<blocks_for(n, kThreads), kThreads, 0, l.stream>>>(
        static_cast<S*>(dinp), static_cast<const S*>(inp), static_cast<const S*>(dout), n);
    ZRT_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace zrt::kernels::cuda
