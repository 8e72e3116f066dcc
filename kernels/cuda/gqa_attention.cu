#include "kernels/cuda/gqa_attention.cuh"

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/flash_attention.cuh"
#include "runtime/device/cuda_device.h"

namespace zrt::kernels::cuda {

namespace {

constexpr int kThreads = 256;

using I64 = std::int64_t;

// qkv[b,t, 0:C] = q[b,t,:]; qkv[b,t, C + h*hs + d] = k[b,t,h/group,d]; the same for v at 2C
// (C = NH*hs): one thread per element of qkv.
template <typename S>
__global__ void pack_gqa_qkv_kernel(S* qkv, const S* q, const S* k, const S* v, int B, int T,
                                    int NH, int group, int hs) {
  const I64 C = static_cast<I64>(NH) * hs;
  const I64 KC = C / group;
  const I64 n = static_cast<I64>(B) * T * 3 * C;
  for (I64 i = blockIdx.x * static_cast<I64>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<I64>(gridDim.x) * blockDim.x) {
    const I64 bt = i / (3 * C);
    const I64 j = i % (3 * C);
    const int part = static_cast<int>(j / C);  // 0 q, 1 k, 2 v
    const I64 c = j % C;
    if (part == 0) {
      qkv[i] = q[bt * C + c];
    } else {
      const I64 h = c / hs, d = c % hs;
      const S* src = part == 1 ? k : v;
      qkv[i] = src[bt * KC + (h / group) * hs + d];
    }
  }
}

// dq[b,t,c] += dqkv[b,t,c]; dk[b,t,kh,d] += sum over g < group of dqkv[b,t, C + (kh*group+g)*hs
// + d], g in order, in fp32 and rounded once; the same for dv from 2C. One thread per element
// of dq, dk and dv together.
template <typename S>
__global__ void unpack_gqa_dqkv_kernel(S* dq, S* dk, S* dv, const S* dqkv, int B, int T, int NH,
                                       int group, int hs) {
  const I64 C = static_cast<I64>(NH) * hs;
  const I64 KC = C / group;
  const I64 per_row = C + 2 * KC;
  const I64 n = static_cast<I64>(B) * T * per_row;
  for (I64 i = blockIdx.x * static_cast<I64>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<I64>(gridDim.x) * blockDim.x) {
    const I64 bt = i / per_row;
    const I64 j = i % per_row;
    const S* row = dqkv + bt * 3 * C;
    if (j < C) {
      S& dst = dq[bt * C + j];
      dst = st<S>(ld(dst) + ld(row[j]));
    } else {
      const bool is_k = j < C + KC;
      const I64 c = is_k ? j - C : j - C - KC;  // kh * hs + d
      const I64 kh = c / hs, d = c % hs;
      const S* src = row + (is_k ? C : 2 * C);
      float sum = 0.0f;
      for (int g = 0; g < group; ++g) sum += ld(src[(kh * group + g) * hs + d]);
      S& dst = (is_k ? dk : dv)[bt * KC + c];
      dst = st<S>(ld(dst) + sum);
    }
  }
}

// `l` with its workspace moved `offset` bytes on: the attention call's share.
Launch after(const Launch& l, I64 offset) {
  Launch sub = l;
  sub.ws = static_cast<char*>(l.ws) + offset;
  return sub;
}

template <typename S>
void pack(const Launch& l, void* qkv, const void* q, const void* k, const void* v, int B, int T,
          int NH, int group, int hs) {
  const I64 n = static_cast<I64>(B) * T * 3 * NH * hs;
  pack_gqa_qkv_kernel<S><<<blocks_for(n, kThreads), kThreads, 0, l.stream>>>(
      static_cast<S*>(qkv), static_cast<const S*>(q), static_cast<const S*>(k),
      static_cast<const S*>(v), B, T, NH, group, hs);
  ZRT_CUDA_LAUNCH_CHECK();
}

}  // namespace

void gqa_attention_forward(const Launch& l, DType dtype, void* out, float* lse, const void* q,
                           const void* k, const void* v, int B, int T, int NH, int NKV, int hs,
                           const AttentionKernels& kernels, const std::int32_t* doc_start,
                           int window) {
  if (gqa_runs_in_place(kernels, dtype, T, NH, NKV, hs)) {
    flash_gqa_forward(l, dtype, out, lse, q, k, v, B, T, NH, NKV, hs, doc_start, window,
                      mma_kernels(kernels));
    return;
  }
  const int group = NH / NKV;
  void* qkv = l.ws;
  with_storage(dtype, [&](auto s) {
    using S = typename decltype(s)::type;
    pack<S>(l, qkv, q, k, v, B, T, NH, group, hs);
  });
  attention_forward(after(l, gqa_packed_bytes(dtype, B, T, NH, hs)), dtype, out, lse, qkv, B, T,
                    NH * hs, NH, kernels, doc_start, window);
}

void gqa_attention_backward(const Launch& l, DType dtype, void* dq, void* dk, void* dv,
                            const void* dout, const void* q, const void* k, const void* v,
                            const void* out, const float* lse, int B, int T, int NH, int NKV,
                            int hs, const AttentionKernels& kernels, const std::int32_t* doc_start,
                            int window) {
  if (gqa_runs_in_place(kernels, dtype, T, NH, NKV, hs)) {
    flash_gqa_backward(l, dtype, dq, dk, dv, dout, q, k, v, out, lse, B, T, NH, NKV, hs, doc_start,
                       window, mma_kernels(kernels));
    return;
  }
  const int group = NH / NKV;
  const I64 packed = gqa_packed_bytes(dtype, B, T, NH, hs);
  void* qkv = l.ws;
  void* dqkv = static_cast<char*>(l.ws) + packed;
  with_storage(dtype, [&](auto s) {
    using S = typename decltype(s)::type;
    pack<S>(l, qkv, q, k, v, B, T, NH, group, hs);
  });
  ZRT_CUDA_CHECK(cudaMemsetAsync(dqkv, 0, static_cast<std::size_t>(packed), l.stream));
  attention_backward(after(l, 2 * packed), dtype, dqkv, dout, qkv, out, lse, B, T, NH * hs, NH,
                     kernels, doc_start, window);
  with_storage(dtype, [&](auto s) {
    using S = typename decltype(s)::type;
    const I64 n = static_cast<I64>(B) * T * (NH + 2 * NKV) * hs;
    unpack_gqa_dqkv_kernel<S><<<blocks_for(n, kThreads), kThreads, 0, l.stream>>>(
        static_cast<S*>(dq), static_cast<S*>(dk), static_cast<S*>(dv), static_cast<const S*>(dqkv),
        B, T, NH, group, hs);
    ZRT_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace zrt::kernels::cuda
