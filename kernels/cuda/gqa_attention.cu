#include "kernels/cuda/gqa_attention.cuh"

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/gemm.cuh"
#include "runtime/device/cuda_device.h"

namespace zrt::kernels::cuda {

namespace {

constexpr int kThreads = 256;

using I64 = std::int64_t;

// dst[b,h,t,d] (fp32, NH heads) = src[b,t,h/group,d] (H = NH/group heads of storage S).
template <typename S>
__global__ void gather_heads_kernel(float* dst, const S* src, int B, int T, int NH, int group,
                                    int hs) {
  const I64 n = static_cast<I64>(B) * NH * T * hs;
  const int H = NH / group;
  for (I64 i = blockIdx.x * static_cast<I64>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<I64>(gridDim.x) * blockDim.x) {
    const int d = static_cast<int>(i % hs);
    const int t = static_cast<int>((i / hs) % T);
    const int h = static_cast<int>((i / (static_cast<I64>(hs) * T)) % NH);
    const I64 b = i / (static_cast<I64>(hs) * T * NH);
    dst[i] = ld(src[((b * T + t) * H + h / group) * hs + d]);
  }
}

// out[b,t,kh,d] (= or +=) sum over g < group of src[b, kh*group + g, t, d], g in order.
template <typename S, bool kAccumulate>
__global__ void scatter_heads_kernel(S* out, const float* src, int B, int T, int NH, int group,
                                     int hs) {
  const int H = NH / group;
  const I64 n = static_cast<I64>(B) * T * H * hs;
  for (I64 i = blockIdx.x * static_cast<I64>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<I64>(gridDim.x) * blockDim.x) {
    const int d = static_cast<int>(i % hs);
    const int kh = static_cast<int>((i / hs) % H);
    const int t = static_cast<int>((i / (static_cast<I64>(hs) * H)) % T);
    const I64 b = i / (static_cast<I64>(hs) * H * T);
    float v = 0.0f;
    for (int g = 0; g < group; ++g) {
      v += src[((b * NH + kh * group + g) * T + t) * hs + d];
    }
    out[i] = st<S>(kAccumulate ? ld(out[i]) + v : v);
  }
}

template <typename S>
void gather(const Launch& l, float* dst, const void* src, int B, int T, int NH, int group, int hs) {
  const I64 n = static_cast<I64>(B) * NH * T * hs;
  gather_heads_kernel<S><<<blocks_for(n, kThreads), kThreads, 0, l.stream>>>(
      dst, static_cast<const S*>(src), B, T, NH, group, hs);
  ZRT_CUDA_LAUNCH_CHECK();
}

template <typename S, bool kAccumulate>
void scatter(const Launch& l, void* out, const float* src, int B, int T, int NH, int group,
             int hs) {
  const I64 n = static_cast<I64>(B) * T * (NH / group) * hs;
  scatter_heads_kernel<S, kAccumulate><<<blocks_for(n, kThreads), kThreads, 0, l.stream>>>(
      static_cast<S*>(out), src, B, T, NH, group, hs);
  ZRT_CUDA_LAUNCH_CHECK();
}

}  // namespace

std::int64_t gqa_attention_forward_workspace(int B, int T, int NH, int /*NKV*/, int hs) {
  return 4 * static_cast<I64>(B) * NH * T * hs * static_cast<I64>(sizeof(float));
}

void gqa_attention_forward(const Launch& l, DType dtype, void* out, float* att, const void* q,
                           const void* k, const void* v, int B, int T, int NH, int NKV, int hs) {
  const int group = NH / NKV;
  const I64 part = static_cast<I64>(B) * NH * T * hs;
  float* fq = static_cast<float*>(l.ws);
  float* fk = fq + part;
  float* fv = fk + part;
  float* y = fv + part;
  const int batch = B * NH;
  const I64 mat = static_cast<I64>(T) * hs;
  const I64 sq = static_cast<I64>(T) * T;
  const float scale = 1.0f / sqrtf(static_cast<float>(hs));
  with_storage(dtype, [&](auto s) {
    using S = typename decltype(s)::type;
    gather<S>(l, fq, q, B, T, NH, 1, hs);
    gather<S>(l, fk, k, B, T, NH, group, hs);
    gather<S>(l, fv, v, B, T, NH, group, hs);
    gemm_strided_batched(l, false, true, T, T, hs, scale, fq, CUDA_R_32F, hs, mat, fk, CUDA_R_32F,
                         hs, mat, 0.0f, att, CUDA_R_32F, T, sq, batch);
    causal_softmax(l, att, static_cast<I64>(batch) * T, T);
    gemm_strided_batched(l, false, false, T, hs, T, 1.0f, att, CUDA_R_32F, T, sq, fv, CUDA_R_32F,
                         hs, mat, 0.0f, y, CUDA_R_32F, hs, mat, batch);
    scatter<S, false>(l, out, y, B, T, NH, 1, hs);
  });
}

std::int64_t gqa_attention_backward_workspace(int B, int T, int NH, int /*NKV*/, int hs) {
  return (7 * static_cast<I64>(B) * NH * T * hs + static_cast<I64>(B) * NH * T * T) *
         static_cast<I64>(sizeof(float));
}

void gqa_attention_backward(const Launch& l, DType dtype, void* dq, void* dk, void* dv,
                            const void* dout, const void* q, const void* k, const void* v,
                            const float* att, int B, int T, int NH, int NKV, int hs) {
  const int group = NH / NKV;
  const I64 part = static_cast<I64>(B) * NH * T * hs;
  float* fq = static_cast<float*>(l.ws);
  float* fk = fq + part;
  float* fv = fk + part;
  float* dy = fv + part;
  float* fdq = dy + part;
  float* fdk = fdq + part;
  float* fdv = fdk + part;
  float* datt = fdv + part;
  const int batch = B * NH;
  const I64 mat = static_cast<I64>(T) * hs;
  const I64 sq = static_cast<I64>(T) * T;
  const float scale = 1.0f / sqrtf(static_cast<float>(hs));
  with_storage(dtype, [&](auto s) {
    using S = typename decltype(s)::type;
    gather<S>(l, fq, q, B, T, NH, 1, hs);
    gather<S>(l, fk, k, B, T, NH, group, hs);
    gather<S>(l, fv, v, B, T, NH, group, hs);
    gather<S>(l, dy, dout, B, T, NH, 1, hs);
    // datt = dy v^T; dv = att^T dy (per query head; summed over the group when scattered)
    gemm_strided_batched(l, false, true, T, T, hs, 1.0f, dy, CUDA_R_32F, hs, mat, fv, CUDA_R_32F,
                         hs, mat, 0.0f, datt, CUDA_R_32F, T, sq, batch);
    gemm_strided_batched(l, true, false, T, hs, T, 1.0f, att, CUDA_R_32F, T, sq, dy, CUDA_R_32F, hs,
                         mat, 0.0f, fdv, CUDA_R_32F, hs, mat, batch);
    causal_softmax_backward(l, datt, att, static_cast<I64>(batch) * T, T);
    // dq = scale ds k; dk = scale ds^T q
    gemm_strided_batched(l, false, false, T, hs, T, scale, datt, CUDA_R_32F, T, sq, fk, CUDA_R_32F,
                         hs, mat, 0.0f, fdq, CUDA_R_32F, hs, mat, batch);
    gemm_strided_batched(l, true, false, T, hs, T, scale, datt, CUDA_R_32F, T, sq, fq, CUDA_R_32F,
                         hs, mat, 0.0f, fdk, CUDA_R_32F, hs, mat, batch);
    scatter<S, true>(l, dq, fdq, B, T, NH, 1, hs);
    scatter<S, true>(l, dk, fdk, B, T, NH, group, hs);
    scatter<S, true>(l, dv, fdv, B, T, NH, group, hs);
  });
}

}  // namespace zrt::kernels::cuda
