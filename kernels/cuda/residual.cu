#include "kernels/cuda/residual.cuh"

#include "kernels/cuda/device_math.cuh"
#include "runtime/device/cuda_device.h"

namespace zrt::kernels::cuda {

namespace {

constexpr int kThreads = 256;

template <typename S>
__global__ void residual_forward_kernel(S* out, const S* a, const S* b, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    out[i] = st<S>(ld(a[i]) + ld(b[i]));
  }
}

// da and db may be the same array (it then receives 2*dout), so each is read and written in
// turn by the one thread that owns index i.
template <typename S>
__global__ void residual_backward_kernel(S* da, S* db, const S* dout, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float d = ld(dout[i]);
    da[i] = st<S>(ld(da[i]) + d);
    db[i] = st<S>(ld(db[i]) + d);
  }
}

}  // namespace

void residual_forward(const Launch& l, DType dtype, void* out, const void* a, const void* b,
                      std::int64_t n) {
  with_storage(dtype, [&](auto s) {
    using S = typename decltype(s)::type;
    residual_forward_kernel<S><<<blocks_for(n, kThreads), kThreads, 0, l.stream>>>(
        static_cast<S*>(out), static_cast<const S*>(a), static_cast<const S*>(b), n);
    ZRT_CUDA_LAUNCH_CHECK();
  });
}

void residual_backward(const Launch& l, DType dtype, void* da, void* db, const void* dout,
                       std::int64_t n) {
  with_storage(dtype, [&](auto s) {
    using S = typename decltype(s)::type;
    residual_backward_kernel<S><<<blocks_for(n, kThreads), kThreads, 0, l.stream>>>(
        static_cast<S*>(da), static_cast<S*>(db), static_cast<const S*>(dout), n);
    ZRT_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace zrt::kernels::cuda
