#include "kernels/cuda/moe_router.cuh"

#include "kernels/cuda/device_math.cuh"
#include "kernels/moe_limits.h"
#include "runtime/device/cuda_device.h"

namespace zrt::kernels::cuda {

namespace {

constexpr int kThreads = 256;
using I64 = std::int64_t;

// Softmax of one row into p, returning its log-sum-exp; the CPU twin's loops, in fp32.
template <typename S>
__device__ float softmax_row(float* p, const S* logits, int E) {
  float m = -INFINITY;
  for (int e = 0; e < E; ++e) m = fmaxf(m, ld(logits[e]));
  float sum = 0.0f;
  for (int e = 0; e < E; ++e) {
    p[e] = expf(ld(logits[e]) - m);
    sum += p[e];
  }
  for (int e = 0; e < E; ++e) p[e] /= sum;
  return m + logf(sum);
}

template <typename S>
__global__ void moe_router_forward_kernel(float* probs, float* weights, std::int32_t* experts,
                                          const S* logits, int N, int E, int k, int renormalize) {
  for (I64 n = blockIdx.x * static_cast<I64>(blockDim.x) + threadIdx.x; n < N;
       n += static_cast<I64>(gridDim.x) * blockDim.x) {
    float* p = probs + n * E;
    float* w = weights + n * k;
    std::int32_t* idx = experts + n * k;
    softmax_row(p, logits + n * E, E);
    // Top-k in (probability descending, index ascending) order: each pick is the largest element
    // ordered after the previous one (kernels/cpu/moe_router.cc).
    float prev_v = INFINITY;
    int prev_i = -1;
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) {
      int best = -1;
      float best_v = 0.0f;
      for (int e = 0; e < E; ++e) {
        const float v = p[e];
        const bool after_prev = v < prev_v || (v == prev_v && e > prev_i);
        if (after_prev && (best < 0 || v > best_v)) {
          best = e;
          best_v = v;
        }
      }
      idx[j] = best;
      w[j] = best_v;
      sum += best_v;
      prev_v = best_v;
      prev_i = best;
    }
    if (renormalize) {
      for (int j = 0; j < k; ++j) w[j] /= sum;
    }
  }
}

template <typename S>
__global__ void moe_router_backward_kernel(S* dlogits, const float* dweights, const float* probs,
                                           const std::int32_t* experts, const float* dprobs_shared,
                                           int N, int E, int k, int renormalize, int overwrite) {
  for (I64 n = blockIdx.x * static_cast<I64>(blockDim.x) + threadIdx.x; n < N;
       n += static_cast<I64>(gridDim.x) * blockDim.x) {
    const float* p = probs + n * E;
    const std::int32_t* idx = experts + n * k;
    S* dl = dlogits + n * E;
    float dv[kMoeMaxTopK];
    if (dweights == nullptr) {
      for (int j = 0; j < k; ++j) dv[j] = 0.0f;
    } else if (renormalize) {
      float sum = 0.0f;
      for (int j = 0; j < k; ++j) sum += p[idx[j]];
      float dot = 0.0f;
      for (int j = 0; j < k; ++j) dot += dweights[n * k + j] * (p[idx[j]] / sum);
      for (int j = 0; j < k; ++j) dv[j] = (dweights[n * k + j] - dot) / sum;
    } else {
      for (int j = 0; j < k; ++j) dv[j] = dweights[n * k + j];
    }
    auto dprob = [&](int e) {
      float d = dprobs_shared != nullptr ? dprobs_shared[e] : 0.0f;
      for (int j = 0; j < k; ++j) {
        if (idx[j] == e) d += dv[j];
      }
      return d;
    };
    float dot = 0.0f;
    for (int e = 0; e < E; ++e) dot += p[e] * dprob(e);
    for (int e = 0; e < E; ++e) {
      const float g = p[e] * (dprob(e) - dot);
      dl[e] = st<S>(overwrite ? g : ld(dl[e]) + g);
    }
  }
}

// One block per expert: its column of probs and its selections, each thread over a fixed stride
// of rows, then the block's fixed reduction tree.
__global__ void moe_aux_stats_kernel(float* counts, float* probsum, const float* probs,
                                     const std::int32_t* experts, int N, int E, int k) {
  __shared__ float scratch[32];
  const int e = blockIdx.x;
  float sum = 0.0f;
  float count = 0.0f;  // exact below 2^24 selections per thread
  for (int n = threadIdx.x; n < N; n += blockDim.x) {
    sum += probs[static_cast<I64>(n) * E + e];
    for (int j = 0; j < k; ++j) count += experts[static_cast<I64>(n) * k + j] == e ? 1.0f : 0.0f;
  }
  sum = block_sum(sum, scratch);
  count = block_sum(count, scratch);
  if (threadIdx.x == 0) {
    counts[e] += count;
    probsum[e] += sum;
  }
}

__global__ void moe_load_balancing_loss_kernel(float* loss, const float* counts,
                                               const float* probsum, int E, float rows) {
  float sum = 0.0f;
  for (int e = 0; e < E; ++e) sum += (counts[e] / rows) * (probsum[e] / rows);
  loss[0] = sum * static_cast<float>(E);
}

__global__ void moe_add_loss_term_kernel(float* loss, const float* term, float coef) {
  loss[0] += coef * term[0];
}

__global__ void moe_load_balancing_loss_backward_kernel(float* dprobs_shared, const float* counts,
                                                        float dloss, int E, float rows) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e < E) dprobs_shared[e] = dloss * static_cast<float>(E) * (counts[e] / rows) / rows;
}

template <typename S>
__device__ float row_lse(const S* l, int E) {
  float m = -INFINITY;
  for (int e = 0; e < E; ++e) m = fmaxf(m, ld(l[e]));
  float s = 0.0f;
  for (int e = 0; e < E; ++e) s += expf(ld(l[e]) - m);
  return m + logf(s);
}

// One block: each thread's rows in a fixed stride, summed in double, then a fixed tree.
template <typename S>
__global__ void moe_router_z_loss_forward_kernel(float* loss, const S* logits, int N, int E) {
  __shared__ double partial[kThreads];
  double sum = 0.0;
  for (int n = threadIdx.x; n < N; n += blockDim.x) {
    const double lse = row_lse(logits + static_cast<I64>(n) * E, E);
    sum += lse * lse;
  }
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) loss[0] = static_cast<float>(N > 0 ? partial[0] / N : 0.0);
}

template <typename S>
__global__ void moe_router_z_loss_backward_kernel(S* dlogits, const S* logits, float dloss, int N,
                                                  int E) {
  for (I64 n = blockIdx.x * static_cast<I64>(blockDim.x) + threadIdx.x; n < N;
       n += static_cast<I64>(gridDim.x) * blockDim.x) {
    const S* l = logits + n * E;
    S* dl = dlogits + n * E;
    float m = -INFINITY;
    for (int e = 0; e < E; ++e) m = fmaxf(m, ld(l[e]));
    float s = 0.0f;
    for (int e = 0; e < E; ++e) s += expf(ld(l[e]) - m);
    const float lse = m + logf(s);
    const float scale = dloss * 2.0f * lse / static_cast<float>(N);
    for (int e = 0; e < E; ++e) {
      const float p = expf(ld(l[e]) - m) / s;
      dl[e] = st<S>(ld(dl[e]) + scale * p);
    }
  }
}

}  // namespace

void moe_router_forward(const Launch& l, DType dtype, float* probs, float* weights,
                        std::int32_t* experts, const void* logits, int N, int E, int k,
                        bool renormalize) {
  if (N <= 0) return;
  with_storage(dtype, [&](auto s) {
    using S = typename decltype(s)::type;
    moe_router_forward_kernel<S><<<blocks_for(N, kThreads), kThreads, 0, l.stream>>>(
        probs, weights, experts, static_cast<const S*>(logits), N, E, k, renormalize ? 1 : 0);
    ZRT_CUDA_LAUNCH_CHECK();
  });
}

void moe_router_backward(const Launch& l, DType dtype, void* dlogits, const float* dweights,
                         const float* probs, const std::int32_t* experts,
                         const float* dprobs_shared, int N, int E, int k, bool renormalize,
                         GradWrite dlogits_write) {
  if (N <= 0) return;
  with_storage(dtype, [&](auto s) {
    using S = typename decltype(s)::type;
    moe_router_backward_kernel<S><<<blocks_for(N, kThreads), kThreads, 0, l.stream>>>(
        static_cast<S*>(dlogits), dweights, probs, experts, dprobs_shared, N, E, k,
        renormalize ? 1 : 0, dlogits_write == GradWrite::kOverwrite ? 1 : 0);
    ZRT_CUDA_LAUNCH_CHECK();
  });
}

void moe_aux_stats_accumulate(const Launch& l, float* counts, float* probsum, const float* probs,
                              const std::int32_t* experts, int N, int E, int k) {
  if (E <= 0) return;
  moe_aux_stats_kernel<<<E, kThreads, 0, l.stream>>>(counts, probsum, probs, experts, N, E, k);
  ZRT_CUDA_LAUNCH_CHECK();
}

void moe_load_balancing_loss(const Launch& l, float* loss, const float* counts,
                             const float* probsum, int E, std::int64_t total_rows) {
  moe_load_balancing_loss_kernel<<<1, 1, 0, l.stream>>>(loss, counts, probsum, E,
                                                        static_cast<float>(total_rows));
  ZRT_CUDA_LAUNCH_CHECK();
}

void moe_add_loss_term(const Launch& l, float* loss, const float* term, float coef) {
  moe_add_loss_term_kernel<<<1, 1, 0, l.stream>>>(loss, term, coef);
  ZRT_CUDA_LAUNCH_CHECK();
}

void moe_load_balancing_loss_backward(const Launch& l, float* dprobs_shared, const float* counts,
                                      float dloss, int E, std::int64_t total_rows) {
  if (E <= 0) return;
  moe_load_balancing_loss_backward_kernel<<<blocks_for(E, kThreads), kThreads, 0, l.stream>>>(
      dprobs_shared, counts, dloss, E, static_cast<float>(total_rows));
  ZRT_CUDA_LAUNCH_CHECK();
}

void moe_router_z_loss_forward(const Launch& l, DType dtype, float* loss, const void* logits, int N,
                               int E) {
  with_storage(dtype, [&](auto s) {
    using S = typename decltype(s)::type;
    moe_router_z_loss_forward_kernel<S>
        <<<1, kThreads, 0, l.stream>>>(loss, static_cast<const S*>(logits), N, E);
    ZRT_CUDA_LAUNCH_CHECK();
  });
}

void moe_router_z_loss_backward(const Launch& l, DType dtype, void* dlogits, const void* logits,
                                float dloss, int N, int E) {
  if (N <= 0) return;
  with_storage(dtype, [&](auto s) {
    using S = typename decltype(s)::type;
    moe_router_z_loss_backward_kernel<S><<<blocks_for(N, kThreads), kThreads, 0, l.stream>>>(
        static_cast<S*>(dlogits), static_cast<const S*>(logits), dloss, N, E);
    ZRT_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace zrt::kernels::cuda
