#include "kernels/cuda/attention.cuh"

#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/flash_attention.cuh"
#include "kernels/cuda/gemm.cuh"
#include "runtime/device/cuda_device.h"

namespace zrt::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kRowsPerBlock = kThreads / 32;

using I64 = std::int64_t;

// q/k/v[b,h,t,d] = qkv[b,t, which*C + h*hs + d] as fp32, for `which` in 0..parts-1 (parts = 3
// for qkv, 1 for dout (B,T,C)).
template <typename S>
__global__ void permute_kernel(float* dst, const S* src, int B, int T, int C, int NH, int parts) {
  const int hs = C / NH;
  const I64 n = static_cast<I64>(B) * T * parts * C;
  const I64 part_size = static_cast<I64>(B) * T * C;
  for (I64 i = blockIdx.x * static_cast<I64>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<I64>(gridDim.x) * blockDim.x) {
    const int col = static_cast<int>(i % (parts * C));
    const I64 bt = i / (parts * C);
    const int t = static_cast<int>(bt % T);
    const int b = static_cast<int>(bt / T);
    const int which = col / C;
    const int h = (col % C) / hs;
    const int d = col % hs;
    dst[which * part_size + ((static_cast<I64>(b) * NH + h) * T + t) * hs + d] = ld(src[i]);
  }
}

// out[b,t, which*C + h*hs + d] (= or +=) src[which][b,h,t,d].
template <typename S, bool kAccumulate>
__global__ void unpermute_kernel(S* out, const float* src, int B, int T, int C, int NH, int parts) {
  const int hs = C / NH;
  const I64 n = static_cast<I64>(B) * T * parts * C;
  const I64 part_size = static_cast<I64>(B) * T * C;
  for (I64 i = blockIdx.x * static_cast<I64>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<I64>(gridDim.x) * blockDim.x) {
    const int col = static_cast<int>(i % (parts * C));
    const I64 bt = i / (parts * C);
    const int t = static_cast<int>(bt % T);
    const int b = static_cast<int>(bt / T);
    const int which = col / C;
    const int h = (col % C) / hs;
    const int d = col % hs;
    const float v = src[which * part_size + ((static_cast<I64>(b) * NH + h) * T + t) * hs + d];
    out[i] = st<S>(kAccumulate ? ld(out[i]) + v : v);
  }
}

// Causal softmax of each row (one warp per row of `rows` = B*NH*T), in place; zeros above the
// diagonal. lse (may be null): each row's log-sum-exp of the scores it was given.
__global__ void causal_softmax_kernel(float* att, float* lse, I64 rows, int T) {
  const I64 row = static_cast<I64>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int t = static_cast<int>(row % T);
  float* a = att + row * T;
  float mx = -INFINITY;
  for (int u = lane; u <= t; u += 32) mx = fmaxf(mx, a[u]);
  mx = warp_max(mx);
  float sum = 0.0f;
  for (int u = lane; u <= t; u += 32) sum += expf(a[u] - mx);
  sum = warp_sum(sum);
  const float inv = 1.0f / sum;
  for (int u = lane; u < T; u += 32) a[u] = u <= t ? expf(a[u] - mx) * inv : 0.0f;
  if (lse != nullptr && lane == 0) lse[row] = mx + logf(sum);
}

// att <- exp(att - lse[row]) below the diagonal, 0 above: the probabilities again from the
// scores and the forward's log-sum-exp (one warp per row).
__global__ void causal_probs_kernel(float* att, const float* lse, I64 rows, int T) {
  const I64 row = static_cast<I64>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int t = static_cast<int>(row % T);
  float* a = att + row * T;
  const float l = lse[row];
  for (int u = lane; u < T; u += 32) a[u] = u <= t ? expf(a[u] - l) : 0.0f;
}

// Packed documents and sliding windows: att[row][u] <- -inf for the keys u before the first key
// query t of sequence b may see (doc_start[b, t] (0 without documents), or t - window + 1 when
// a window starts later; row = (b*NH + h)*T + t; one warp per row), so that the softmax passes,
// which keep u <= t, give them probability exp(-inf) = 0. The key t itself is never masked, so
// no row is left without a finite score.
__global__ void document_mask_kernel(float* att, const std::int32_t* doc_start, int window,
                                     I64 rows, int T, int NH) {
  const I64 row = static_cast<I64>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int t = static_cast<int>(row % T);
  const I64 b = row / (static_cast<I64>(NH) * T);
  int first = doc_start != nullptr ? doc_start[b * T + t] : 0;
  if (window > 0) first = max(first, t - window + 1);
  float* a = att + row * T;
  for (int u = lane; u < first; u += 32) a[u] = -INFINITY;
}

// datt <- att * (datt - rowsum(att * datt)) below the diagonal, 0 above (one warp per row).
__global__ void softmax_backward_kernel(float* datt, const float* att, I64 rows, int T) {
  const I64 row = static_cast<I64>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int t = static_cast<int>(row % T);
  const float* a = att + row * T;
  float* d = datt + row * T;
  float dot = 0.0f;
  for (int u = lane; u <= t; u += 32) dot += a[u] * d[u];
  dot = warp_sum(dot);
  for (int u = lane; u < T; u += 32) d[u] = u <= t ? a[u] * (d[u] - dot) : 0.0f;
}

template <typename S>
void permute(const Launch& l, float* dst, const void* src, int B, int T, int C, int NH, int parts) {
  const I64 n = static_cast<I64>(B) * T * parts * C;
  permute_kernel<S><<<blocks_for(n, kThreads), kThreads, 0, l.stream>>>(
      dst, static_cast<const S*>(src), B, T, C, NH, parts);
  ZRT_CUDA_LAUNCH_CHECK();
}

template <typename S, bool kAccumulate>
void unpermute(const Launch& l, void* out, const float* src, int B, int T, int C, int NH,
               int parts) {
  const I64 n = static_cast<I64>(B) * T * parts * C;
  unpermute_kernel<S, kAccumulate><<<blocks_for(n, kThreads), kThreads, 0, l.stream>>>(
      static_cast<S*>(out), src, B, T, C, NH, parts);
  ZRT_CUDA_LAUNCH_CHECK();
}

unsigned row_blocks(I64 rows) {
  return static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
}

// The scores of `rows` = B*NH*T rows outside each query's document or window to -inf (none
// without doc_start and window: the unpacked op launches nothing more).
void mask_documents(const Launch& l, float* att, const std::int32_t* doc_start, int window,
                    I64 rows, int T, int NH) {
  if (doc_start == nullptr && window <= 0) return;
  document_mask_kernel<<<row_blocks(rows), kThreads, 0, l.stream>>>(att, doc_start, window, rows, T,
                                                                    NH);
  ZRT_CUDA_LAUNCH_CHECK();
}

}  // namespace

void causal_softmax(const Launch& l, float* att, std::int64_t rows, int T, float* lse) {
  causal_softmax_kernel<<<row_blocks(rows), kThreads, 0, l.stream>>>(att, lse, rows, T);
  ZRT_CUDA_LAUNCH_CHECK();
}

void causal_softmax_backward(const Launch& l, float* datt, const float* att, std::int64_t rows,
                             int T) {
  softmax_backward_kernel<<<row_blocks(rows), kThreads, 0, l.stream>>>(datt, att, rows, T);
  ZRT_CUDA_LAUNCH_CHECK();
}

namespace {
// The fused kernels asked for; the WMMA ones take head size 64 only, so 128 runs on mma.sync.
FlashKernels fused_kernels(const AttentionKernels& kernels, DType dtype, int T, int C, int NH) {
  if (kernels.wmma && flash_attention_supported(dtype, T, C, NH, FlashKernels::kWmma)) {
    return FlashKernels::kWmma;
  }
  return mma_kernels(kernels);
}
}  // namespace

void attention_forward(const Launch& l, DType dtype, void* out, float* lse, const void* qkv, int B,
                       int T, int C, int NH, const AttentionKernels& kernels,
                       const std::int32_t* doc_start, int window) {
  if (runs_fused(kernels, dtype, T, C, NH)) {
    flash_attention_forward(l, dtype, out, lse, qkv, B, T, C, NH,
                            fused_kernels(kernels, dtype, T, C, NH), doc_start, window);
    return;
  }
  const int hs = C / NH;
  const I64 part = static_cast<I64>(B) * T * C;
  float* q = static_cast<float*>(l.ws);
  float* k = q + part;
  float* v = k + part;
  float* y = v + part;
  float* att = y + part;
  const int batch = B * NH;
  const I64 mat = static_cast<I64>(T) * hs;
  const I64 sq = static_cast<I64>(T) * T;
  const float scale = 1.0f / sqrtf(static_cast<float>(hs));
  with_storage(dtype, [&](auto s) {
    using S = typename decltype(s)::type;
    permute<S>(l, q, qkv, B, T, C, NH, 3);
    gemm_strided_batched(l, false, true, T, T, hs, scale, q, CUDA_R_32F, hs, mat, k, CUDA_R_32F, hs,
                         mat, 0.0f, att, CUDA_R_32F, T, sq, batch);
    mask_documents(l, att, doc_start, window, static_cast<I64>(batch) * T, T, NH);
    causal_softmax(l, att, static_cast<I64>(batch) * T, T, lse);
    gemm_strided_batched(l, false, false, T, hs, T, 1.0f, att, CUDA_R_32F, T, sq, v, CUDA_R_32F, hs,
                         mat, 0.0f, y, CUDA_R_32F, hs, mat, batch);
    unpermute<S, false>(l, out, y, B, T, C, NH, 1);
  });
}

void attention_backward(const Launch& l, DType dtype, void* dqkv, const void* dout, const void* qkv,
                        const void* out, const float* lse, int B, int T, int C, int NH,
                        const AttentionKernels& kernels, const std::int32_t* doc_start,
                        int window) {
  if (runs_fused(kernels, dtype, T, C, NH)) {
    flash_attention_backward(l, dtype, dqkv, dout, qkv, out, lse, B, T, C, NH,
                             fused_kernels(kernels, dtype, T, C, NH), doc_start, window);
    return;
  }
  const int hs = C / NH;
  const I64 part = static_cast<I64>(B) * T * C;
  float* q = static_cast<float*>(l.ws);
  float* k = q + part;
  float* v = k + part;
  float* dy = v + part;
  float* dq = dy + part;
  float* dk = dq + part;
  float* dv = dk + part;
  float* att = dv + part;
  float* datt = att + static_cast<I64>(B) * NH * T * T;
  const int batch = B * NH;
  const I64 mat = static_cast<I64>(T) * hs;
  const I64 sq = static_cast<I64>(T) * T;
  const float scale = 1.0f / sqrtf(static_cast<float>(hs));
  const I64 rows = static_cast<I64>(batch) * T;
  with_storage(dtype, [&](auto s) {
    using S = typename decltype(s)::type;
    permute<S>(l, q, qkv, B, T, C, NH, 3);
    permute<S>(l, dy, dout, B, T, C, NH, 1);
    // att = exp(scale q k^T - lse): the forward's probabilities, recomputed.
    gemm_strided_batched(l, false, true, T, T, hs, scale, q, CUDA_R_32F, hs, mat, k, CUDA_R_32F, hs,
                         mat, 0.0f, att, CUDA_R_32F, T, sq, batch);
    mask_documents(l, att, doc_start, window, rows, T, NH);  // exp(-inf - lse) = 0 outside them
    causal_probs_kernel<<<row_blocks(rows), kThreads, 0, l.stream>>>(att, lse, rows, T);
    ZRT_CUDA_LAUNCH_CHECK();
    // datt = dy v^T; dv = att^T dy
    gemm_strided_batched(l, false, true, T, T, hs, 1.0f, dy, CUDA_R_32F, hs, mat, v, CUDA_R_32F, hs,
                         mat, 0.0f, datt, CUDA_R_32F, T, sq, batch);
    gemm_strided_batched(l, true, false, T, hs, T, 1.0f, att, CUDA_R_32F, T, sq, dy, CUDA_R_32F, hs,
                         mat, 0.0f, dv, CUDA_R_32F, hs, mat, batch);
    // ds = att (datt - rowsum(att datt)); rowsum(att datt) is D = dout . out up to rounding.
    causal_softmax_backward(l, datt, att, rows, T);
    // dq = scale ds k; dk = scale ds^T q
    gemm_strided_batched(l, false, false, T, hs, T, scale, datt, CUDA_R_32F, T, sq, k, CUDA_R_32F,
                         hs, mat, 0.0f, dq, CUDA_R_32F, hs, mat, batch);
    gemm_strided_batched(l, true, false, T, hs, T, scale, datt, CUDA_R_32F, T, sq, q, CUDA_R_32F,
                         hs, mat, 0.0f, dk, CUDA_R_32F, hs, mat, batch);
    unpermute<S, true>(l, dqkv, dq, B, T, C, NH, 3);
  });
}

}  // namespace zrt::kernels::cuda
