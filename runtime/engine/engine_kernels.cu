// CUDA twins of the engine kernels in engine_kernels.cc (same math, see engine_kernels.h).
#include <cuda_runtime.h>

#include <cstdint>

#include "runtime/common/dtype.h"
#include "runtime/common/error.h"
#include "runtime/device/cuda_device.h"
#include "runtime/device/cuda_float16.cuh"
#include "runtime/engine/step_decision.h"

namespace zrt::engine_kernels::cuda {

namespace {

constexpr int kThreads = 256;

template <typename T>
struct TypeTag {
  using type = T;
};

__device__ inline float load(const void* p, int type, std::int64_t i) {
  switch (type) {
    case 0:
      return static_cast<const float*>(p)[i];
    case 1:
      return cuda_float16::to_float(static_cast<const __nv_bfloat16*>(p)[i]);
    default:
      return cuda_float16::to_float(static_cast<const __half*>(p)[i]);
  }
}

__device__ inline void store(void* p, int type, std::int64_t i, float v) {
  switch (type) {
    case 0:
      static_cast<float*>(p)[i] = v;
      break;
    case 1:
      static_cast<__nv_bfloat16*>(p)[i] = cuda_float16::to_bf16_rn(v);
      break;
    default:
      static_cast<__half*>(p)[i] = cuda_float16::to_fp16_rn(v);
      break;
  }
}

int type_code(DType t) {
  switch (t) {
    case DType::kFloat32:
      return 0;
    case DType::kBFloat16:
      return 1;
    case DType::kFloat16:
      return 2;
    default:
      ZRT_THROW(InvalidArgument, "engine kernel on non-float type {}", dtype_name(t));
  }
}

// Grid-stride copy whose stores go over the bus to mapped host memory.
__global__ void store_to_host_kernel(const float* src, float* dst, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = src[i];
  }
}

__global__ void convert_kernel(const void* src, int st, void* dst, int dt, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    store(dst, dt, i, load(src, st, i));
  }
}

__global__ void accumulate_kernel(const void* src, int st, void* dst, int dt, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    store(dst, dt, i, __fadd_rn(load(dst, dt, i), load(src, st, i)));
  }
}

__global__ void scale_kernel(void* x, int t, std::int64_t n, float factor) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    store(x, t, i, __fmul_rn(load(x, t, i), factor));
  }
}

// The squared norm in two deterministic passes: a fixed grid of kNormBlocks blocks each sums a
// fixed strided subset in fp64 (block partials in a fixed tree order), then one block adds the
// partials in a fixed tree order. Same input, same bits, on every run; and the whole GPU streams
// the gradient instead of one SM (the earlier one-block kernel took a third of a GPT-2 step).
constexpr int kNormBlocks = 512;
constexpr int kNormThreads = 256;

__device__ double block_sum(double v, double* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
  return shared[0];
}

// Each thread squares 16-byte packs of W elements (W = 1: a buffer not 16-byte aligned), with
// kNormInFlight packs loaded before the first is added: the pass is bound by the memory's
// bandwidth only if enough bytes are in flight (a GPT-2 step's 498 MB of fp32 gradients, one
// 4-byte load in flight a thread: ~0.5 MB in flight, a fifth of an H200's bandwidth; 64 bytes a
// thread: 8 MB). Pack p goes to thread p mod (grid x block), the elements past the last whole
// pack to block 0's first threads, so each block's subset and its order are fixed.
constexpr int kNormInFlight = 4;

template <typename T>
__device__ inline double squared(T v) {
  const double d = cuda_float16::to_float(v);
  return d * d;
}
template <>
__device__ inline double squared<float>(float v) {
  const double d = v;
  return d * d;
}

template <typename T, int W>
__global__ void __launch_bounds__(kNormThreads)
    sum_squares_partials_kernel(const T* x, std::int64_t n, double* partials) {
  struct alignas(sizeof(T) * W) Pack {
    T v[W];
  };
  __shared__ double shared[kNormThreads];
  const Pack* packs = reinterpret_cast<const Pack*>(x);
  const std::int64_t count = n / W;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  std::int64_t p = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  double sum = 0.0;
  for (; p + (kNormInFlight - 1) * stride < count; p += kNormInFlight * stride) {
    Pack v[kNormInFlight];
#pragma unroll
    for (int u = 0; u < kNormInFlight; ++u) v[u] = packs[p + u * stride];
#pragma unroll
    for (int u = 0; u < kNormInFlight; ++u) {
#pragma unroll
      for (int e = 0; e < W; ++e) sum += squared(v[u].v[e]);
    }
  }
  for (; p < count; p += stride) {
    const Pack v = packs[p];
#pragma unroll
    for (int e = 0; e < W; ++e) sum += squared(v.v[e]);
  }
  const std::int64_t rest = count * W + threadIdx.x;
  if (blockIdx.x == 0 && rest < n) sum += squared(x[rest]);  // fewer than W < blockDim.x left
  const double total = block_sum(sum, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

__global__ void sum_partials_kernel(const double* partials, int count, float* acc) {
  __shared__ double shared[kNormBlocks];
  const double total = block_sum(threadIdx.x < count ? partials[threadIdx.x] : 0.0, shared);
  if (threadIdx.x == 0) *acc = __fadd_rn(*acc, static_cast<float>(total));
}

// One thread: the decision is a handful of double operations on one value.
__global__ void decide_step_kernel(const float* norm_squared, StepDecisionInputs inputs,
                                   StepDecision* out) {
  *out = zrt::decide_step(*norm_squared, inputs);
}

unsigned blocks_for(std::int64_t n) {
  const std::int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 65535 ? 65535 : blocks));
}

}  // namespace

void convert(Stream& s, const void* src, DType st, void* dst, DType dt, std::int64_t n) {
  if (n == 0) return;
  convert_kernel<<<blocks_for(n), kThreads, 0, cuda_stream_handle(s)>>>(src, type_code(st), dst,
                                                                        type_code(dt), n);
  ZRT_CUDA_CHECK(cudaGetLastError());
}

void accumulate(Stream& s, const void* src, DType st, void* dst, DType dt, std::int64_t n) {
  if (n == 0) return;
  accumulate_kernel<<<blocks_for(n), kThreads, 0, cuda_stream_handle(s)>>>(src, type_code(st), dst,
                                                                           type_code(dt), n);
  ZRT_CUDA_CHECK(cudaGetLastError());
}

void scale(Stream& s, void* x, DType t, std::int64_t n, float factor) {
  if (n == 0) return;
  scale_kernel<<<blocks_for(n), kThreads, 0, cuda_stream_handle(s)>>>(x, type_code(t), n, factor);
  ZRT_CUDA_CHECK(cudaGetLastError());
}

void add_sum_squares(Stream& s, const void* x, DType t, std::int64_t n, float* acc) {
  if (n == 0) return;
  cudaStream_t stream = cuda_stream_handle(s);
  // Scratch for the block partials: 4 KiB from the stream-ordered pool, freed in stream order
  // after the second pass, so concurrent streams never share it.
  void* partials = nullptr;
  ZRT_CUDA_CHECK(cudaMallocAsync(&partials, kNormBlocks * sizeof(double), stream));
  const auto launch = [&](auto type) {
    using T = typename decltype(type)::type;
    const T* values = static_cast<const T*>(x);
    constexpr int kWide = static_cast<int>(16 / sizeof(T));
    if (reinterpret_cast<std::uintptr_t>(x) % 16 == 0) {
      sum_squares_partials_kernel<T, kWide>
          <<<kNormBlocks, kNormThreads, 0, stream>>>(values, n, static_cast<double*>(partials));
    } else {
      sum_squares_partials_kernel<T, 1>
          <<<kNormBlocks, kNormThreads, 0, stream>>>(values, n, static_cast<double*>(partials));
    }
  };
  switch (type_code(t)) {
    case 0:
      launch(TypeTag<float>{});
      break;
    case 1:
      launch(TypeTag<__nv_bfloat16>{});
      break;
    default:
      launch(TypeTag<__half>{});
      break;
  }
  ZRT_CUDA_CHECK(cudaGetLastError());
  sum_partials_kernel<<<1, kNormBlocks, 0, stream>>>(static_cast<const double*>(partials),
                                                     kNormBlocks, acc);
  ZRT_CUDA_CHECK(cudaGetLastError());
  ZRT_CUDA_CHECK(cudaFreeAsync(partials, stream));
}

void store_to_pinned_host(Stream& s, const float* src, float* dst, std::int64_t n) {
  if (n == 0) return;
  // Pinned memory from cudaHostAlloc is mapped at the same address on every device (unified
  // addressing, all 64-bit platforms CUDA supports), so the kernel writes it through `dst`.
  store_to_host_kernel<<<blocks_for(n), kThreads, 0, cuda_stream_handle(s)>>>(src, dst, n);
  ZRT_CUDA_CHECK(cudaGetLastError());
}

void decide_step(Stream& s, const float* norm_squared, const StepDecisionInputs& inputs,
                 StepDecision* out) {
  decide_step_kernel<<<1, 1, 0, cuda_stream_handle(s)>>>(norm_squared, inputs, out);
  ZRT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zrt::engine_kernels::cuda
