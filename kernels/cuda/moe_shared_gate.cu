#include "kernels/cuda/moe_shared_gate.cuh"

#include "kernels/cuda/device_math.cuh"
#include "runtime/device/cuda_device.h"

namespace zrt::kernels::cuda {

namespace {

constexpr int kThreads = 256;
using I64 = std::int64_t;

template <typename S>
__global__ void moe_shared_gate_forward_kernel(S* out, const S* s, const S* g, int N, int C) {
  for (I64 i = blockIdx.x * static_cast<I64>(blockDim.x) + threadIdx.x; i < I64{N} * C;
       i += static_cast<I64>(gridDim.x) * blockDim.x) {
    const float gate = 1.0f / (1.0f + expf(-ld(g[i / C])));
    out[i] = st<S>(ld(out[i]) + gate * ld(s[i]));
  }
}

template <typename S>
__global__ void moe_shared_gate_backward_kernel(S* ds, S* dg, const S* dout, const S* s, const S* g,
                                                int N, int C) {
  for (I64 n = blockIdx.x * static_cast<I64>(blockDim.x) + threadIdx.x; n < N;
       n += static_cast<I64>(gridDim.x) * blockDim.x) {
    const float gate = 1.0f / (1.0f + expf(-ld(g[n])));
    float dot = 0.0f;
    for (int c = 0; c < C; ++c) {
      const float dc = ld(dout[n * C + c]);
      dot += dc * ld(s[n * C + c]);
      ds[n * C + c] = st<S>(gate * dc);
    }
    dg[n] = st<S>(gate * (1.0f - gate) * dot);
  }
}

}  // namespace

void moe_shared_gate_forward(const Launch& l, DType dtype, void* out, const void* s, const void* g,
                             int N, int C) {
  if (N <= 0 || C <= 0) return;
  with_storage(dtype, [&](auto st) {
    using S = typename decltype(st)::type;
    moe_shared_gate_forward_kernel<S><<<blocks_for(I64{N} * C, kThreads), kThreads, 0, l.stream>>>(
        static_cast<S*>(out), static_cast<const S*>(s), static_cast<const S*>(g), N, C);
    ZRT_CUDA_LAUNCH_CHECK();
  });
}

void moe_shared_gate_backward(const Launch& l, DType dtype, void* ds, void* dg, const void* dout,
                              const void* s, const void* g, int N, int C) {
  if (N <= 0 || C <= 0) return;
  with_storage(dtype, [&](auto st) {
    using S = typename decltype(st)::type;
    moe_shared_gate_backward_kernel<S><<<blocks_for(N, kThreads), kThreads, 0, l.stream>>>(
        static_cast<S*>(ds), static_cast<S*>(dg), static_cast<const S*>(dout),
        static_cast<const S*>(s), static_cast<const S*>(g), N, C);
    ZRT_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace zrt::kernels::cuda
