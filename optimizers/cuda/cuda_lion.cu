#include "optimizers/cuda/cuda_lion_kernel.h"
#include "optimizers/cuda/cuda_optimizer_io.cuh"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace zrt::detail {

namespace {

using Desc = CudaLionDesc;

constexpr int kThreads = 256;
constexpr int kPerThread = 8;  // elements per thread, loaded before any is computed (ILP)
constexpr std::int64_t kBlockElems = kThreads * kPerThread;
static_assert(kBlockElems == kCudaLionBlockElems, "block size");

template <int G, int O, bool kDecay>
__device__ __forceinline__ void update_block(const Desc& d, std::int64_t base,
                                             const LionStepScalars& s) {
  float p[kPerThread], g[kPerThread], m[kPerThread];
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const std::int64_t i = base + threadIdx.x + j * kThreads;
    if (i < d.numel) {
      p[j] = d.param[i];
      g[j] = load_grad<G>(d.grad, i);
      m[j] = d.exp_avg[i];
    }
  }
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const std::int64_t i = base + threadIdx.x + j * kThreads;
    if (i < d.numel) {
      lion_update_element<kDecay>(p[j], g[j], m[j], s);
      d.param[i] = p[j];
      d.exp_avg[i] = m[j];
      store_out<O>(d.param_out, i, p[j]);
    }
  }
}

template <int G, int O>
__device__ __forceinline__ void dispatch_decay(const Desc& d, std::int64_t base,
                                               const LionStepScalars& s) {
  if (s.has_weight_decay && d.weight_decay != 0) return update_block<G, O, true>(d, base, s);
  update_block<G, O, false>(d, base, s);
}

template <int G>
__device__ __forceinline__ void dispatch_out(const Desc& d, std::int64_t base,
                                             const LionStepScalars& s) {
  switch (d.out_kind) {
    case 0:
      return dispatch_decay<G, 0>(d, base, s);
    case 1:
      return dispatch_decay<G, 1>(d, base, s);
    case 2:
      return dispatch_decay<G, 2>(d, base, s);
    default:
      return dispatch_decay<G, 3>(d, base, s);
  }
}

// One block per kBlockElems elements of one slice; the block finds its slice by binary search
// over the slices' first blocks.
__global__ void __launch_bounds__(kThreads)
    lion_kernel(const Desc* __restrict__ table, int count, LionStepScalars s) {
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

void launch_cuda_lion(const CudaLionDesc* table, int count, int blocks, const LionStepScalars& s,
                      cudaStream_t stream) {
  lion_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(table, count, s);
}

}  // namespace zrt::detail
