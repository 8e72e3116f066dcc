#include "kernels/cuda/crossentropy.cuh"

#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/gemm.cuh"
#include "runtime/device/cuda_device.h"

namespace zrt::kernels::cuda {

namespace {

constexpr int kThreads = 256;
using I64 = std::int64_t;

// The row's max and sum of exp(x - max) in one read of the row (a running max per thread, its
// sum rescaled when the max grows; then the block's max and the rescaled sums): the logits are
// the largest tensor of a step (N x 50304 for GPT-2), so each pass over them counts.
template <typename S>
__device__ void row_stats(const S* row, int V, float* scratch, float& mx, float& sum) {
  float m = -INFINITY, s = 0.0f;
  for (int v = threadIdx.x; v < V; v += blockDim.x) {
    const float x = ld(row[v]);
    if (x > m) {
      s = s * expf(m - x) + 1.0f;
      m = x;
    } else {
      s += expf(x - m);
    }
  }
  mx = block_max(m, scratch);
  sum = block_sum(m == -INFINITY ? 0.0f : s * expf(m - mx), scratch);
}

template <typename S>
__global__ void crossentropy_forward_kernel(float* losses, const S* logits,
                                            const std::int32_t* targets, int V, int ldl) {
  __shared__ float scratch[32];
  const int n = blockIdx.x;
  const S* row = logits + static_cast<I64>(n) * ldl;
  const int target = targets[n];
  if (target < 0) {  // not in the loss (the whole block returns: no reduction to join)
    if (threadIdx.x == 0) losses[n] = 0.0f;
    return;
  }
  float mx, sum;
  row_stats(row, V, scratch, mx, sum);
  if (threadIdx.x == 0) losses[n] = logf(sum) + mx - ld(row[target]);
}

// In place when dlogits == logits: every thread reads element v before writing it, and the
// statistics are complete (block_sum synchronizes) before any write. With `losses` (the fused
// classifier of a training step) the row's loss comes from the same statistics, its target
// logit read before that synchronisation; the row's second read here follows the first
// closely enough to come from L2 (a 100 KB row per block). A row whose target is < 0 is out of
// the loss: its loss is 0 and its gradient row (padding included) all zeros.
template <typename S>
__global__ void crossentropy_backward_kernel(S* dlogits, float* losses, const S* logits,
                                             const std::int32_t* targets, float dloss, int V,
                                             int ldl) {
  __shared__ float scratch[32];
  const int n = blockIdx.x;
  const S* row = logits + static_cast<I64>(n) * ldl;
  S* drow = dlogits + static_cast<I64>(n) * ldl;
  const int target = targets[n];
  if (target < 0) {  // the whole block returns before any reduction
    if (losses != nullptr && threadIdx.x == 0) losses[n] = 0.0f;
    for (int v = threadIdx.x; v < ldl; v += blockDim.x) drow[v] = st<S>(0.0f);
    return;
  }
  const float x_target = ld(row[target]);
  float mx, sum;
  row_stats(row, V, scratch, mx, sum);
  if (losses != nullptr && threadIdx.x == 0) losses[n] = logf(sum) + mx - x_target;
  const float inv = 1.0f / sum;
  for (int v = threadIdx.x; v < V; v += blockDim.x) {
    const float p = expf(ld(row[v]) - mx) * inv;
    drow[v] = st<S>((p - (v == target ? 1.0f : 0.0f)) * dloss);
  }
  for (int v = V + threadIdx.x; v < ldl; v += blockDim.x) drow[v] = st<S>(0.0f);
}

// out[0] = (sum of losses, in double, in a fixed tree order) / (divisor > 0 ? divisor : N).
__global__ void loss_mean_kernel(float* out, const float* losses, int N, float divisor) {
  __shared__ double partial[kThreads];
  double sum = 0.0;
  for (int i = threadIdx.x; i < N; i += kThreads) sum += losses[i];
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const double denominator = divisor > 0.0f ? static_cast<double>(divisor) : N;
    out[0] = static_cast<float>(partial[0] / denominator);
  }
}

}  // namespace

std::int64_t logits_workspace(DType dtype, int C, int V, int ldl) {
  return ldl == V ? 0 : static_cast<I64>(ldl) * C * static_cast<I64>(dtype_size(dtype));
}

namespace {
// wte (V,C) copied into l.ws as ldl rows, the rows from V on zero: the GEMMs then run over the
// padded vocabulary (an M or K of ldl, a multiple of 8) and cuBLAS picks aligned kernels; with
// V = 50257 it falls back to align1 kernels at about a sixth of the speed.
const void* padded_wte(const Launch& l, DType dtype, const void* wte, int C, int V, int ldl) {
  if (ldl == V) return wte;
  const std::size_t row = static_cast<std::size_t>(C) * dtype_size(dtype);
  ZRT_CUDA_CHECK(cudaMemcpyAsync(l.ws, wte, row * static_cast<std::size_t>(V),
                                 cudaMemcpyDeviceToDevice, l.stream));
  ZRT_CUDA_CHECK(cudaMemsetAsync(static_cast<std::byte*>(l.ws) + row * static_cast<std::size_t>(V),
                                 0, row * static_cast<std::size_t>(ldl - V), l.stream));
  return l.ws;
}
}  // namespace

void logits_forward(const Launch& l, DType dtype, void* logits, const void* inp, const void* wte,
                    int N, int C, int V, int ldl) {
  const cudaDataType type = to_cuda_dtype(dtype);
  // All ldl columns: the padding ones come out as zero logits (zero weight rows).
  gemm(l, false, true, N, ldl, C, 1.0f, inp, type, C, padded_wte(l, dtype, wte, C, V, ldl), type, C,
       0.0f, logits, type, ldl);
}

void logits_backward(const Launch& l, DType dtype, DType grad_dtype, void* dinp, void* dwte,
                     const void* dlogits, const void* inp, const void* wte, int N, int C, int V,
                     int ldl) {
  const cudaDataType type = to_cuda_dtype(dtype);
  // dinp sums over the padded vocabulary: crossentropy_backward left zeros in the padding.
  gemm(l, false, false, N, C, ldl, 1.0f, dlogits, type, ldl, padded_wte(l, dtype, wte, C, V, ldl),
       type, C, 1.0f, dinp, type, C);
  if (dwte == nullptr) return;  // a head that is not trained
  gemm(l, true, false, V, C, N, 1.0f, dlogits, type, ldl, inp, type, C, 1.0f, dwte,
       to_cuda_dtype(grad_dtype), C);
}

void crossentropy_forward(const Launch& l, DType dtype, float* losses, const void* logits,
                          const std::int32_t* targets, int N, int V, int ldl) {
  if (N <= 0) return;
  with_storage(dtype, [&](auto s) {
    using S = typename decltype(s)::type;
    crossentropy_forward_kernel<S>
        <<<N, kThreads, 0, l.stream>>>(losses, static_cast<const S*>(logits), targets, V, ldl);
    ZRT_CUDA_LAUNCH_CHECK();
  });
}

void crossentropy_backward(const Launch& l, DType dtype, void* dlogits, const void* logits,
                           const std::int32_t* targets, float dloss, int N, int V, int ldl) {
  crossentropy_forward_backward(l, dtype, nullptr, dlogits, logits, targets, dloss, N, V, ldl);
}

void crossentropy_forward_backward(const Launch& l, DType dtype, float* losses, void* dlogits,
                                   const void* logits, const std::int32_t* targets, float dloss,
                                   int N, int V, int ldl) {
  if (N <= 0) return;
  with_storage(dtype, [&](auto s) {
    using S = typename decltype(s)::type;
    crossentropy_backward_kernel<S><<<N, kThreads, 0, l.stream>>>(
        static_cast<S*>(dlogits), losses, static_cast<const S*>(logits), targets, dloss, V, ldl);
    ZRT_CUDA_LAUNCH_CHECK();
  });
}

void loss_mean(const Launch& l, float* out, const float* losses, int N, float divisor) {
  loss_mean_kernel<<<1, kThreads, 0, l.stream>>>(out, losses, N, divisor);
  ZRT_CUDA_LAUNCH_CHECK();
}

}  // namespace zrt::kernels::cuda
