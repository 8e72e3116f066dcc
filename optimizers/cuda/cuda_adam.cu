#include "optimizers/cuda/cuda_adam_kernel.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "runtime/device/cuda_float16.cuh"

namespace zrt::detail {

namespace {

using Desc = CudaAdamDesc;

constexpr int kThreads = 256;
constexpr int kPerThread = 8;  // elements per thread, loaded before any is computed (ILP)
constexpr std::int64_t kBlockElems = kThreads * kPerThread;
static_assert(kBlockElems == kCudaAdamBlockElems, "block size");

template <int G>  // 0 fp32, 1 bf16, 2 fp16
__device__ __forceinline__ float load_grad(const void* grad, std::int64_t i) {
  if constexpr (G == 0) {
    return static_cast<const float*>(grad)[i];
  } else if constexpr (G == 1) {
    return cuda_float16::bf16_bits_to_float(static_cast<const unsigned short*>(grad)[i]);
  } else {
    return cuda_float16::to_float(__ushort_as_half(static_cast<const unsigned short*>(grad)[i]));
  }
}

template <int O>  // 0 none, 1 fp32, 2 bf16, 3 fp16
__device__ __forceinline__ void store_out(void* out, std::int64_t i, float p) {
  if constexpr (O == 1) {
    static_cast<float*>(out)[i] = p;
  } else if constexpr (O == 2) {
    // The same roundings as dtype.h's to_bf16 / to_fp16 (nearest even; NaN as there).
    static_cast<unsigned short*>(out)[i] = cuda_float16::float_to_bf16_bits(p);
  } else if constexpr (O == 3) {
    static_cast<unsigned short*>(out)[i] = cuda_float16::float_to_fp16_bits(p);
  }
}

template <int G, int O, AdamDecayMode M>
__device__ __forceinline__ void update_block(const Desc& d, std::int64_t base,
                                             const AdamStepScalars& s) {
  float p[kPerThread], g[kPerThread], m[kPerThread], v[kPerThread];
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const std::int64_t i = base + threadIdx.x + j * kThreads;
    if (i < d.numel) {
      p[j] = d.param[i];
      g[j] = load_grad<G>(d.grad, i);
      m[j] = d.exp_avg[i];
      v[j] = d.exp_avg_sq[i];
    }
  }
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const std::int64_t i = base + threadIdx.x + j * kThreads;
    if (i < d.numel) {
      adam_update_element<M>(p[j], g[j], m[j], v[j], s);
      d.param[i] = p[j];
      d.exp_avg[i] = m[j];
      d.exp_avg_sq[i] = v[j];
      store_out<O>(d.param_out, i, p[j]);
    }
  }
}

template <int G, int O>
__device__ __forceinline__ void dispatch_mode(const Desc& d, std::int64_t base,
                                              const AdamStepScalars& s) {
  switch (adam_decay_mode(s, d.weight_decay != 0)) {
    case AdamDecayMode::kNone:
      return update_block<G, O, AdamDecayMode::kNone>(d, base, s);
    case AdamDecayMode::kDecoupled:
      return update_block<G, O, AdamDecayMode::kDecoupled>(d, base, s);
    case AdamDecayMode::kL2:
      return update_block<G, O, AdamDecayMode::kL2>(d, base, s);
  }
}

template <int G>
__device__ __forceinline__ void dispatch_out(const Desc& d, std::int64_t base,
                                             const AdamStepScalars& s) {
  switch (d.out_kind) {
    case 0:
      return dispatch_mode<G, 0>(d, base, s);
    case 1:
      return dispatch_mode<G, 1>(d, base, s);
    case 2:
      return dispatch_mode<G, 2>(d, base, s);
    default:
      return dispatch_mode<G, 3>(d, base, s);
  }
}

// One block per kBlockElems elements of one slice; the block finds its slice by binary search
// over the slices' first blocks.
__global__ void __launch_bounds__(kThreads)
    adam_kernel(const Desc* __restrict__ table, int count, AdamStepScalars s) {
  __shared__ int slice;
  if (threadIdx.x == 0) {
    const std::int64_t block = blockIdx.x;
    int lo = 0, hi = count - 1;  // largest k with table[k].first_block <= block
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (table[mid].first_block <= block) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    slice = lo;
  }
  __syncthreads();
  const Desc d = table[slice];
  const std::int64_t base = (static_cast<std::int64_t>(blockIdx.x) - d.first_block) * kBlockElems;
  switch (d.grad_kind) {
    case 0:
      return dispatch_out<0>(d, base, s);
    case 1:
      return dispatch_out<1>(d, base, s);
    default:
      return dispatch_out<2>(d, base, s);
  }
}

}  // namespace

void launch_cuda_adam(const CudaAdamDesc* table, int count, int blocks, const AdamStepScalars& s,
                      cudaStream_t stream) {
  adam_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(table, count, s);
}

}  // namespace zrt::detail
