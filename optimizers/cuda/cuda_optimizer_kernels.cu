// The fused multi-tensor optimizer kernel, written once over an optimizer's Math (AdamMath,
// LionMath: adam_math.h, lion_math.h): Math::with_update() picks the element update U a slice
// gets (its weight-decay form) and U::element() is the optimizer's *_update_element(), so the
// kernel's results equal the CPU optimizers' bit for bit. One thread block per
// kCudaOptimizerBlockElems elements of one slice; it finds its slice by binary search over the
// slices' first blocks.
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "optimizers/cuda/cuda_optimizer_io.cuh"
#include "optimizers/cuda/cuda_optimizer_kernels.h"

namespace zrt::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kPerThread = 8;  // elements per thread, loaded before any is computed (ILP)
constexpr std::int64_t kBlockElems = kThreads * kPerThread;
static_assert(kBlockElems == kCudaOptimizerBlockElems, "block size");

template <typename U, int G, int O>
__device__ __forceinline__ void update_block(const CudaOptimizerDesc& d, std::int64_t base,
                                             const typename U::Scalars& s) {
  float p[kPerThread], g[kPerThread], state[kPerThread][U::kStates];
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const std::int64_t i = base + threadIdx.x + j * kThreads;
    if (i < d.numel) {
      p[j] = d.param[i];
      g[j] = load_grad<G>(d.grad, i);
#pragma unroll
      for (int k = 0; k < U::kStates; ++k) state[j][k] = d.state[k][i];
    }
  }
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const std::int64_t i = base + threadIdx.x + j * kThreads;
    if (i < d.numel) {
      U::element(p[j], g[j], state[j], s);
      d.param[i] = p[j];
#pragma unroll
      for (int k = 0; k < U::kStates; ++k) d.state[k][i] = state[j][k];
      store_out<O>(d.param_out, i, p[j]);
    }
  }
}

template <typename F, int G>
__device__ __forceinline__ void dispatch_out(const CudaOptimizerDesc& d, std::int64_t base,
                                             const typename F::Scalars& s) {
  auto run = [&](auto out) {
    F::with_update(s, d.weight_decay != 0, [&](auto update) {
      update_block<decltype(update), G, decltype(out)::value>(d, base, s);
    });
  };
  switch (d.out_kind) {
    case 0:
      return run(std::integral_constant<int, 0>{});
    case 1:
      return run(std::integral_constant<int, 1>{});
    case 2:
      return run(std::integral_constant<int, 2>{});
    default:
      return run(std::integral_constant<int, 3>{});
  }
}

template <typename F>
__device__ __forceinline__ void multi_tensor_update(const CudaOptimizerDesc* __restrict__ table,
                                                    int count, const typename F::Scalars& s) {
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
  const CudaOptimizerDesc d = table[slice];
  const std::int64_t base = (static_cast<std::int64_t>(blockIdx.x) - d.first_block) * kBlockElems;
  switch (d.grad_kind) {
    case 0:
      return dispatch_out<F, 0>(d, base, s);
    case 1:
      return dispatch_out<F, 1>(d, base, s);
    default:
      return dispatch_out<F, 2>(d, base, s);
  }
}

template <typename Math>
__global__ void __launch_bounds__(kThreads)
    optimizer_kernel(const CudaOptimizerDesc* __restrict__ table, int count,
                     typename Math::Scalars s, const StepDecision* __restrict__ decision) {
  if (decision != nullptr) {
    // The same value in every thread of every block: the whole grid returns, or none of it.
    if (decision->apply == 0) return;
    s.grad_scale = decision->grad_scale;
  }
  multi_tensor_update<Math>(table, count, s);
}

}  // namespace

template <typename Math>
void launch_cuda_optimizer(const CudaOptimizerDesc* table, int count, int blocks,
                           const typename Math::Scalars& s, const StepDecision* decision,
                           cudaStream_t stream) {
  optimizer_kernel<Math>
      <<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(table, count, s, decision);
}

template void launch_cuda_optimizer<AdamMath>(const CudaOptimizerDesc*, int, int,
                                              const AdamStepScalars&, const StepDecision*,
                                              cudaStream_t);
template void launch_cuda_optimizer<LionMath>(const CudaOptimizerDesc*, int, int,
                                              const LionStepScalars&, const StepDecision*,
                                              cudaStream_t);

}  // namespace zrt::detail
