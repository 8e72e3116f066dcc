#include "kernels/cuda/swiglu.cuh"

#include "kernels/cuda/device_math.cuh"
#include "runtime/device/cuda_device.h"

namespace zrt::kernels::cuda {

namespace {

constexpr int kThreads = 256;

template <typename S>
__global__ void swiglu_forward_kernel(S* out, const S* gate, const S* up, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float g = ld(gate[i]);
    const float sig = 1.0f / (1.0f + expf(-g));
    out[i] = st<S>(g * sig * ld(up[i]));
  }
}

template <typename S>
__global__ void swiglu_backward_kernel(S* dgate, S* dup, const S* dout, const S* gate, const S* up,
                                       std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float g = ld(gate[i]);
    const float u = ld(up[i]);
    const float dy = ld(dout[i]);
    const float sig = 1.0f / (1.0f + expf(-g));
    dgate[i] = st<S>(ld(dgate[i]) + dy * u * sig * (1.0f + g * (1.0f - sig)));
    dup[i] = st<S>(ld(dup[i]) + dy * g * sig);
  }
}

}  // namespace

void swiglu_forward(const Launch& l, DType dtype, void* out, const void* gate, const void* up,
                    std::int64_t n) {
  with_storage(dtype, [&](auto s) {
    using S = typename decltype(s)::type;
    swiglu_forward_kernel<S><<<blocks_for(n, kThreads), kThreads, 0, l.stream>>>(
        static_cast<S*>(out), static_cast<const S*>(gate), static_cast<const S*>(up), n);
    ZRT_CUDA_LAUNCH_CHECK();
  });
}

void swiglu_backward(const Launch& l, DType dtype, void* dgate, void* dup, const void* dout,
                     const void* gate, const void* up, std::int64_t n) {
  with_storage(dtype, [&](auto s) {
    using S = typename decltype(s)::type;
    swiglu_backward_kernel<S><<<blocks_for(n, kThreads), kThreads, 0, l.stream>>>(
        static_cast<S*>(dgate), static_cast<S*>(dup), static_cast<const S*>(dout),
        static_cast<const S*>(gate), static_cast<const S*>(up), n);
    ZRT_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace zrt::kernels::cuda
