#include "kernels/cuda/moe_permute.cuh"

#include "kernels/cuda/device_math.cuh"
#include "runtime/device/cuda_device.h"

namespace zrt::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kRankThreads = 1024;  // pairs ranked per step of the per-expert scan
using I64 = std::int64_t;

// Block e ranks the pairs choosing expert e in pair order: row_of[p] = the number of earlier pairs
// choosing e (the expert's offset is added by the next kernel), counts[e] = how many chose it.
// Each step counts a chunk of blockDim.x pairs with a ballot per warp and the warps' totals.
__global__ void moe_rank_kernel(std::int32_t* counts, std::int32_t* row_of,
                                const std::int32_t* experts, I64 pairs) {
  __shared__ int warp_counts[kRankThreads / 32];
  const int e = blockIdx.x;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int warps = blockDim.x / 32;
  int running = 0;  // pairs choosing e before this chunk
  for (I64 base = 0; base < pairs; base += blockDim.x) {
    const I64 p = base + threadIdx.x;
    const bool mine = p < pairs && experts[p] == e;
    const unsigned ballot = __ballot_sync(0xffffffffu, mine);
    if (lane == 0) warp_counts[warp] = __popc(ballot);
    __syncthreads();
    int before = running;
    for (int w = 0; w < warp; ++w) before += warp_counts[w];
    if (mine) row_of[p] = before + __popc(ballot & ((1u << lane) - 1u));
    for (int w = 0; w < warps; ++w) running += warp_counts[w];
    __syncthreads();  // warp_counts is rewritten by the next chunk
  }
  if (threadIdx.x == 0) counts[e] = running;
}

// One thread per pair: its row is its expert's offset plus its rank. Every block scans the counts
// into shared memory (E + 1 ints), block 0 also stores them.
__global__ void moe_rows_kernel(std::int32_t* offsets, std::int32_t* row_of, std::int32_t* source,
                                const std::int32_t* counts, const std::int32_t* experts, I64 pairs,
                                int E) {
  extern __shared__ int shared_offsets[];
  if (threadIdx.x == 0) {
    int sum = 0;
    for (int e = 0; e < E; ++e) {
      shared_offsets[e] = sum;
      sum += counts[e];
    }
    shared_offsets[E] = sum;
  }
  __syncthreads();
  if (blockIdx.x == 0) {
    for (int e = threadIdx.x; e <= E; e += blockDim.x) offsets[e] = shared_offsets[e];
  }
  for (I64 p = blockIdx.x * static_cast<I64>(blockDim.x) + threadIdx.x; p < pairs;
       p += static_cast<I64>(gridDim.x) * blockDim.x) {
    const std::int32_t e = experts[p];
    if (e < 0 || e >= E) {
      row_of[p] = -1;
      continue;
    }
    const std::int32_t r = shared_offsets[e] + row_of[p];
    row_of[p] = r;
    source[r] = static_cast<std::int32_t>(p);
  }
}

template <typename S>
__global__ void moe_gather_kernel(S* xe, const S* x, const std::int32_t* row_of, int N, int k,
                                  int C) {
  const I64 total = I64{N} * k * C;
  for (I64 i = blockIdx.x * static_cast<I64>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<I64>(gridDim.x) * blockDim.x) {
    const I64 p = i / C;
    const int c = static_cast<int>(i % C);
    const std::int32_t r = row_of[p];
    if (r >= 0) xe[static_cast<I64>(r) * C + c] = x[(p / k) * C + c];
  }
}

template <typename S>
__global__ void moe_gather_backward_kernel(S* dx, const S* dxe, const std::int32_t* row_of, int N,
                                           int k, int C) {
  const I64 total = I64{N} * C;
  for (I64 i = blockIdx.x * static_cast<I64>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<I64>(gridDim.x) * blockDim.x) {
    const I64 n = i / C;
    const int c = static_cast<int>(i % C);
    float sum = ld(dx[i]);
    for (int j = 0; j < k; ++j) {
      const std::int32_t r = row_of[n * k + j];
      if (r >= 0) sum += ld(dxe[static_cast<I64>(r) * C + c]);
    }
    dx[i] = st<S>(sum);
  }
}

template <typename S>
__global__ void moe_combine_kernel(S* out, const S* y, const float* weights,
                                   const std::int32_t* row_of, int N, int k, int C) {
  const I64 total = I64{N} * C;
  for (I64 i = blockIdx.x * static_cast<I64>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<I64>(gridDim.x) * blockDim.x) {
    const I64 n = i / C;
    const int c = static_cast<int>(i % C);
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) {
      const std::int32_t r = row_of[n * k + j];
      if (r >= 0) sum += weights[n * k + j] * ld(y[static_cast<I64>(r) * C + c]);
    }
    out[i] = st<S>(sum);
  }
}

template <typename S>
__global__ void moe_combine_backward_dy_kernel(S* dy, const S* dout, const float* weights,
                                               const std::int32_t* row_of, int N, int k, int C) {
  const I64 total = I64{N} * k * C;
  for (I64 i = blockIdx.x * static_cast<I64>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<I64>(gridDim.x) * blockDim.x) {
    const I64 p = i / C;
    const int c = static_cast<int>(i % C);
    const std::int32_t r = row_of[p];
    if (r >= 0) dy[static_cast<I64>(r) * C + c] = st<S>(weights[p] * ld(dout[(p / k) * C + c]));
  }
}

// One warp per pair: lane-strided partial dots, then the warp's fixed shuffle tree.
template <typename S>
__global__ void moe_combine_backward_dw_kernel(float* dweights, const S* dout, const S* y,
                                               const std::int32_t* row_of, int N, int k, int C) {
  const I64 pairs = I64{N} * k;
  const int lane = threadIdx.x % 32;
  const I64 warps = static_cast<I64>(gridDim.x) * (blockDim.x / 32);
  for (I64 p = blockIdx.x * static_cast<I64>(blockDim.x / 32) + threadIdx.x / 32; p < pairs;
       p += warps) {
    const std::int32_t r = row_of[p];
    float dot = 0.0f;
    if (r >= 0) {
      const S* g = dout + (p / k) * C;
      const S* yr = y + static_cast<I64>(r) * C;
      for (int c = lane; c < C; c += 32) dot += ld(g[c]) * ld(yr[c]);
    }
    dot = warp_sum(dot);
    if (lane == 0) dweights[p] = dot;
  }
}

}  // namespace

void moe_dispatch_plan(const Launch& l, std::int32_t* counts, std::int32_t* offsets,
                       std::int32_t* row_of, std::int32_t* source, const std::int32_t* experts,
                       int N, int k, int E) {
  const I64 pairs = I64{N} * k;
  if (E <= 0) return;
  moe_rank_kernel<<<E, kRankThreads, 0, l.stream>>>(counts, row_of, experts, pairs);
  ZRT_CUDA_LAUNCH_CHECK();
  const std::size_t shared = (static_cast<std::size_t>(E) + 1) * sizeof(int);
  moe_rows_kernel<<<blocks_for(pairs, kThreads), kThreads, shared, l.stream>>>(
      offsets, row_of, source, counts, experts, pairs, E);
  ZRT_CUDA_LAUNCH_CHECK();
}

void moe_gather(const Launch& l, DType dtype, void* xe, const void* x, const std::int32_t* row_of,
                int N, int k, int C) {
  const I64 total = I64{N} * k * C;
  if (total <= 0) return;
  with_storage(dtype, [&](auto s) {
    using S = typename decltype(s)::type;
    moe_gather_kernel<S><<<blocks_for(total, kThreads), kThreads, 0, l.stream>>>(
        static_cast<S*>(xe), static_cast<const S*>(x), row_of, N, k, C);
    ZRT_CUDA_LAUNCH_CHECK();
  });
}

void moe_gather_backward(const Launch& l, DType dtype, void* dx, const void* dxe,
                         const std::int32_t* row_of, int N, int k, int C) {
  const I64 total = I64{N} * C;
  if (total <= 0) return;
  with_storage(dtype, [&](auto s) {
    using S = typename decltype(s)::type;
    moe_gather_backward_kernel<S><<<blocks_for(total, kThreads), kThreads, 0, l.stream>>>(
        static_cast<S*>(dx), static_cast<const S*>(dxe), row_of, N, k, C);
    ZRT_CUDA_LAUNCH_CHECK();
  });
}

void moe_combine(const Launch& l, DType dtype, void* out, const void* y, const float* weights,
                 const std::int32_t* row_of, int N, int k, int C) {
  const I64 total = I64{N} * C;
  if (total <= 0) return;
  with_storage(dtype, [&](auto s) {
    using S = typename decltype(s)::type;
    moe_combine_kernel<S><<<blocks_for(total, kThreads), kThreads, 0, l.stream>>>(
        static_cast<S*>(out), static_cast<const S*>(y), weights, row_of, N, k, C);
    ZRT_CUDA_LAUNCH_CHECK();
  });
}

void moe_combine_backward(const Launch& l, DType dtype, void* dy, float* dweights, const void* dout,
                          const void* y, const float* weights, const std::int32_t* row_of, int N,
                          int k, int C) {
  const I64 pairs = I64{N} * k;
  if (pairs <= 0) return;
  with_storage(dtype, [&](auto s) {
    using S = typename decltype(s)::type;
    if (C > 0) {
      moe_combine_backward_dy_kernel<S><<<blocks_for(pairs * C, kThreads), kThreads, 0, l.stream>>>(
          static_cast<S*>(dy), static_cast<const S*>(dout), weights, row_of, N, k, C);
      ZRT_CUDA_LAUNCH_CHECK();
    }
    moe_combine_backward_dw_kernel<S><<<blocks_for(pairs, kThreads / 32), kThreads, 0, l.stream>>>(
        dweights, static_cast<const S*>(dout), static_cast<const S*>(y), row_of, N, k, C);
    ZRT_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace zrt::kernels::cuda
