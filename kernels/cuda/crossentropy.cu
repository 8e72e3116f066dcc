#include "kernels/cuda/crossentropy.cuh"

#include <type_traits>

#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/gemm.cuh"
#include "runtime/device/cuda_device.h"

namespace zrt::kernels::cuda {

namespace {

// One block per row. 1024 threads each keep kUnroll 16-byte loads in flight: a GPT-2 row
// (50304 bf16 logits, 100 KB) is then six packs a thread, read by one pass, and the 132 rows an
// H200 works on at once (1.3e7 bytes) stay in L2 for the gradient's second read.
constexpr int kRowThreads = 1024;
constexpr int kUnroll = 4;
constexpr int kThreads = 256;  // loss_mean
constexpr float kLog2e = 1.4426950408889634f;
using I64 = std::int64_t;

// W consecutive logits of a row, loaded and stored as one access when W * sizeof(S) is 16 bytes
// (the row stride a multiple of W, the rows 16-byte aligned), else element by element (W = 1:
// any stride, any alignment).
template <typename S, int W>
struct alignas(W * sizeof(S)) Pack {
  S e[W];
};

template <typename S, int W>
__device__ __forceinline__ Pack<S, W> load_pack(const S* p) {
  if constexpr (W * sizeof(S) == 16) {
    Pack<S, W> out;
    *reinterpret_cast<uint4*>(out.e) = *reinterpret_cast<const uint4*>(p);
    return out;
  } else {
    return *reinterpret_cast<const Pack<S, W>*>(p);
  }
}

// exp(x - m) as exp2: x - m is exact near the row's maximum, where the probabilities are large.
__device__ __forceinline__ float exp_from(float x, float m) {
  return exp2f((x - m) * kLog2e);
}

// Calls f(i, pack) for this thread's packs i = threadIdx.x, + kRowThreads, ... of a row's first
// `packs`, in order, with kUnroll of them loaded before the first is used.
template <typename S, int W, typename F>
__device__ __forceinline__ void for_each_pack(const S* row, int packs, F&& f) {
  for (int i0 = threadIdx.x; i0 < packs; i0 += kUnroll * kRowThreads) {
    Pack<S, W> p[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = i0 + u * kRowThreads;
      if (i < packs) p[u] = load_pack<S, W>(row + static_cast<I64>(i) * W);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = i0 + u * kRowThreads;
      if (i >= packs) break;
      f(i, p[u]);
    }
  }
}

// The row's max and sum of exp(x - max) in one read of its first V logits: per thread a
// running max and a sum rescaled when the max grows (once per pack at most), then the block's
// max and the rescaled sums. The logits are a step's largest tensor (N x 50304 for GPT-2), so
// the read is in packs with kUnroll of them in flight per thread. Every caller of a row with
// the same W gets the same bits (crossentropy_forward's loss is the fused kernel's).
template <typename S, int W>
__device__ void row_stats(const S* row, int V, float* scratch, float& mx, float& sum) {
  const int packs = (V + W - 1) / W;
  float m = -INFINITY, s = 0.0f;
  for_each_pack<S, W>(row, packs, [&](int i, const Pack<S, W>& p) {
    float x[W];
    float pack_max = -INFINITY;
#pragma unroll
    for (int e = 0; e < W; ++e) {
      x[e] = i * W + e < V ? ld(p.e[e]) : -INFINITY;  // the padding is not in the row
      pack_max = fmaxf(pack_max, x[e]);
    }
    if (pack_max > m) {
      s *= exp_from(m, pack_max);  // 0 while m is -inf (s is 0 then too)
      m = pack_max;
    }
    if (m == -INFINITY) return;
#pragma unroll
    for (int e = 0; e < W; ++e) s += exp_from(x[e], m);
  });
  mx = block_max(m, scratch);
  sum = block_sum(m == -INFINITY ? 0.0f : s * exp_from(m, mx), scratch);
}

template <typename S, int W>
__global__ void __launch_bounds__(kRowThreads)
    crossentropy_forward_kernel(float* losses, const S* logits, const std::int32_t* targets, int V,
                                int ldl) {
  __shared__ float scratch[32];
  const int n = blockIdx.x;
  const S* row = logits + static_cast<I64>(n) * ldl;
  const int target = targets[n];
  if (target < 0) {  // not in the loss (the whole block returns: no reduction to join)
    if (threadIdx.x == 0) losses[n] = 0.0f;
    return;
  }
  float mx, sum;
  row_stats<S, W>(row, V, scratch, mx, sum);
  if (threadIdx.x == 0) losses[n] = logf(sum) + mx - ld(row[target]);
}

// Each row's softmax gradient ((p - onehot) * dloss, zeros in the padding from V to ldl), in
// place when dlogits == logits: a thread reads each of its packs before writing it, and the
// statistics are complete (block_sum synchronizes) before any write. With `losses` (the fused
// classifier of a training step) the row's loss comes from the same statistics, its target
// logit read before that synchronisation. The second read of a row comes from L2 (see
// kRowThreads). A row whose target is < 0 is out of the loss: its loss is 0 and its gradient
// row (padding included) all zeros. `vector_out`: dlogits is 16-byte aligned, so the stores
// go as whole packs (the bits are the same either way).
template <typename S, int W>
__global__ void __launch_bounds__(kRowThreads)
    crossentropy_backward_kernel(S* dlogits, float* losses, const S* logits,
                                 const std::int32_t* targets, float dloss, int V, int ldl,
                                 bool vector_out) {
  __shared__ float scratch[32];
  const int n = blockIdx.x;
  const S* row = logits + static_cast<I64>(n) * ldl;
  S* drow = dlogits + static_cast<I64>(n) * ldl;
  const int packs = ldl / W;  // W divides ldl (the launch's choice)
  const auto store = [&](int i, const Pack<S, W>& p) {
    S* at = drow + static_cast<I64>(i) * W;
    if (vector_out) {
      if constexpr (W * sizeof(S) == 16) {
        *reinterpret_cast<uint4*>(at) = *reinterpret_cast<const uint4*>(p.e);
      } else {
        *reinterpret_cast<Pack<S, W>*>(at) = p;
      }
    } else {
#pragma unroll
      for (int e = 0; e < W; ++e) at[e] = p.e[e];
    }
  };
  const int target = targets[n];
  if (target < 0) {  // the whole block returns before any reduction
    if (losses != nullptr && threadIdx.x == 0) losses[n] = 0.0f;
    Pack<S, W> zero;
#pragma unroll
    for (int e = 0; e < W; ++e) zero.e[e] = st<S>(0.0f);
    for (int i = threadIdx.x; i < packs; i += kRowThreads) store(i, zero);
    return;
  }
  const float x_target = ld(row[target]);
  float mx, sum;
  row_stats<S, W>(row, V, scratch, mx, sum);
  if (losses != nullptr && threadIdx.x == 0) losses[n] = logf(sum) + mx - x_target;
  const float inv = 1.0f / sum;
  for_each_pack<S, W>(row, packs, [&](int i, Pack<S, W> p) {
#pragma unroll
    for (int e = 0; e < W; ++e) {
      const int v = i * W + e;
      const float g =
          v < V ? (exp_from(ld(p.e[e]), mx) * inv - (v == target ? 1.0f : 0.0f)) * dloss : 0.0f;
      p.e[e] = st<S>(g);
    }
    store(i, p);
  });
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

namespace {
// The logits GEMM runs over ldl rows of wte (an N of ldl, a multiple of 8: with V = 50257
// cuBLAS falls back to align1 kernels at about a sixth of the speed), rows V on zero, in two
// parts: wte's own first `main` rows (V rounded down to a multiple of 8, read in place) and the
// `tail` rows after them, copied into l.ws with the zero rows, so the padding's logits are zeros
// (GPT-2: 48 rows, 74 KiB, where a padded copy of the whole table moved 77 MB twice a head
// tile). The backward's dinp GEMM reads both parts of wte in place.
constexpr int kVocabAlign = 8;

// The rows of wte the GEMMs read in place: all V when the logits are unpadded, else V rounded
// down to a multiple of kVocabAlign.
int rows_in_place(int V, int ldl) {
  return ldl == V ? V : V / kVocabAlign * kVocabAlign;
}

struct VocabParts {
  int main;               // rows of wte read in place
  int tail;               // rows from `main` to ldl
  const void* tail_rows;  // those rows: wte's, then zeros (null when tail is 0)
};

VocabParts vocab_parts(const Launch& l, DType dtype, const void* wte, int C, int V, int ldl) {
  const int main = rows_in_place(V, ldl);
  if (main == ldl) return {main, 0, nullptr};
  const std::size_t row = static_cast<std::size_t>(C) * dtype_size(dtype);
  if (V > main) {  // else the tail is all padding (and wte + main rows is past its allocation)
    ZRT_CUDA_CHECK(cudaMemcpyAsync(l.ws, static_cast<const std::byte*>(wte) + row * main,
                                   row * static_cast<std::size_t>(V - main),
                                   cudaMemcpyDeviceToDevice, l.stream));
  }
  ZRT_CUDA_CHECK(cudaMemsetAsync(static_cast<std::byte*>(l.ws) + row * (V - main), 0,
                                 row * static_cast<std::size_t>(ldl - V), l.stream));
  return {main, ldl - main, l.ws};
}
}  // namespace

std::int64_t logits_workspace(DType dtype, int C, int V, int ldl) {
  return static_cast<I64>(ldl - rows_in_place(V, ldl)) * C * static_cast<I64>(dtype_size(dtype));
}

void logits_forward(const Launch& l, DType dtype, void* logits, const void* inp, const void* wte,
                    int N, int C, int V, int ldl) {
  const cudaDataType type = to_cuda_dtype(dtype);
  const VocabParts parts = vocab_parts(l, dtype, wte, C, V, ldl);
  // All ldl columns: the padding ones come out as zero logits (zero weight rows).
  if (parts.main > 0) {
    gemm(l, false, true, N, parts.main, C, 1.0f, inp, type, C, wte, type, C, 0.0f, logits, type,
         ldl);
  }
  if (parts.tail > 0) {
    gemm(l, false, true, N, parts.tail, C, 1.0f, inp, type, C, parts.tail_rows, type, C, 0.0f,
         static_cast<std::byte*>(logits) + static_cast<I64>(parts.main) * dtype_size(dtype), type,
         ldl);
  }
}

void logits_backward(const Launch& l, DType dtype, DType grad_dtype, void* dinp, void* dwte,
                     const void* dlogits, const void* inp, const void* wte, int N, int C, int V,
                     int ldl) {
  const cudaDataType type = to_cuda_dtype(dtype);
  // dinp sums over the vocabulary: wte's first `main` rows (a K that is a multiple of 8), then
  // its last V - main rows (none when V is a multiple of 8; the padding's dlogits are zeros, so
  // the padded rows would add nothing), both read in place.
  const int main = rows_in_place(V, ldl);
  if (main > 0) {
    gemm(l, false, false, N, C, main, 1.0f, dlogits, type, ldl, wte, type, C, 1.0f, dinp, type, C);
  }
  if (V > main) {
    const I64 at = static_cast<I64>(main) * dtype_size(dtype);
    gemm(l, false, false, N, C, V - main, 1.0f, static_cast<const std::byte*>(dlogits) + at, type,
         ldl, static_cast<const std::byte*>(wte) + at * C, type, C, 1.0f, dinp, type, C);
  }
  if (dwte == nullptr) return;  // a head that is not trained
  gemm(l, true, false, V, C, N, 1.0f, dlogits, type, ldl, inp, type, C, 1.0f, dwte,
       to_cuda_dtype(grad_dtype), C);
}

namespace {
// Calls f(integral_constant<W>) with W the pack width rows of stride ldl at `logits` allow: 16
// bytes of S when ldl is a multiple of it and the logits are 16-byte aligned, else 1.
template <typename S, typename F>
void with_pack_width(const void* logits, int ldl, F&& f) {
  constexpr int kWide = static_cast<int>(16 / sizeof(S));
  if (ldl % kWide == 0 && aligned16(logits)) {
    f(std::integral_constant<int, kWide>{});
  } else {
    f(std::integral_constant<int, 1>{});
  }
}
}  // namespace

void crossentropy_forward(const Launch& l, DType dtype, float* losses, const void* logits,
                          const std::int32_t* targets, int N, int V, int ldl) {
  if (N <= 0) return;
  with_storage(dtype, [&](auto s) {
    using S = typename decltype(s)::type;
    with_pack_width<S>(logits, ldl, [&](auto w) {
      crossentropy_forward_kernel<S, decltype(w)::value>
          <<<N, kRowThreads, 0, l.stream>>>(losses, static_cast<const S*>(logits), targets, V, ldl);
      ZRT_CUDA_LAUNCH_CHECK();
    });
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
    with_pack_width<S>(logits, ldl, [&](auto w) {
      crossentropy_backward_kernel<S, decltype(w)::value><<<N, kRowThreads, 0, l.stream>>>(
          static_cast<S*>(dlogits), losses, static_cast<const S*>(logits), targets, dloss, V, ldl,
          aligned16(dlogits));
      ZRT_CUDA_LAUNCH_CHECK();
    });
  });
}

void loss_mean(const Launch& l, float* out, const float* losses, int N, float divisor) {
  loss_mean_kernel<<<1, kThreads, 0, l.stream>>>(out, losses, N, divisor);
  ZRT_CUDA_LAUNCH_CHECK();
}

}  // namespace zrt::kernels::cuda
