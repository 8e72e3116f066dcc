#include "kernels/cuda/matmul.cuh"

#include "kernels/cuda/column_sums.cuh"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/layernorm.cuh"
#include "runtime/device/cuda_device.h"

namespace zrt::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kColumnThreads = 128;

template <typename S>
__global__ void add_bias_kernel(S* out, const S* bias, std::int64_t rows, int OC) {
  const std::int64_t n = rows * OC;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    out[i] = st<S>(ld(out[i]) + ld(bias[i % OC]));
  }
}

template <typename S>
__global__ void column_partials_kernel(float* part, const S* dout, int N, int C, int chunks) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  for (int chunk = blockIdx.y; chunk < chunks; chunk += gridDim.y) {  // column_chunk_blocks
    const int r0 = chunk * kColumnSumRows;
    const int r1 = min(N, r0 + kColumnSumRows);
    float sum = 0.0f;
    for (int r = r0; r < r1; ++r) sum += ld(dout[static_cast<std::int64_t>(r) * C + c]);
    part[static_cast<std::int64_t>(chunk) * C + c] = sum;
  }
}

// The chunks' sums of each column (column_sums.cuh's order), added to dbias.
template <typename G>
__global__ void column_finish_kernel(G* dbias, const float* part, int chunks, int C) {
  __shared__ float slice[kFinishSlices][kFinishColumns];
  const float sum = finish_column_sum(part, chunks, C, slice);
  const int c = blockIdx.x * kFinishColumns + threadIdx.x;
  if (threadIdx.y == 0 && c < C) dbias[c] = st<G>(ld(dbias[c]) + sum);
}

template <typename G>
void launch_column_finish(const Launch& l, G* dbias, const float* part, int chunks, int C) {
  column_finish_kernel<G>
      <<<finish_blocks(C), finish_block(), 0, l.stream>>>(dbias, part, chunks, C);
  ZRT_CUDA_LAUNCH_CHECK();
}

int chunks_of(int N) {
  return (N + kColumnSumRows - 1) / kColumnSumRows;
}

}  // namespace

void matmul_forward(const Launch& l, DType dtype, void* out, const void* inp, const void* weight,
                    const void* bias, int N, int C, int OC) {
  const cudaDataType type = to_cuda_dtype(dtype);
  if (bias != nullptr && gemm_bias_lt(l, N, OC, C, inp, C, weight, OC, bias, out, OC, type)) {
    return;
  }
  gemm(l, false, false, N, OC, C, 1.0f, inp, type, C, weight, type, OC, 0.0f, out, type, OC);
  if (bias != nullptr) add_bias(l, dtype, out, bias, N, OC);
}

void add_bias(const Launch& l, DType dtype, void* out, const void* bias, int N, int OC) {
  with_storage(dtype, [&](auto s) {
    using S = typename decltype(s)::type;
    const std::int64_t n = static_cast<std::int64_t>(N) * OC;
    add_bias_kernel<S><<<blocks_for(n, kThreads), kThreads, 0, l.stream>>>(
        static_cast<S*>(out), static_cast<const S*>(bias), N, OC);
    ZRT_CUDA_LAUNCH_CHECK();
  });
}

std::int64_t bias_backward_workspace(int N, int C) {
  return static_cast<std::int64_t>(chunks_of(N)) * C * static_cast<std::int64_t>(sizeof(float));
}

void bias_backward(const Launch& l, DType dtype, DType grad_dtype, void* dbias, const void* dout,
                   int N, int C, void* ws) {
  if (N <= 0) return;  // no rows: nothing to add (and a grid of 0 chunks would not launch)
  const int chunks = chunks_of(N);
  float* part = static_cast<float*>(ws);
  with_storage_grad(dtype, grad_dtype, [&](auto s, auto g) {
    using S = typename decltype(s)::type;
    using G = typename decltype(g)::type;
    const dim3 grid((C + kColumnThreads - 1) / kColumnThreads, column_chunk_blocks(chunks));
    column_partials_kernel<S>
        <<<grid, kColumnThreads, 0, l.stream>>>(part, static_cast<const S*>(dout), N, C, chunks);
    ZRT_CUDA_LAUNCH_CHECK();
    launch_column_finish<G>(l, static_cast<G*>(dbias), part, chunks, C);
  });
}

void weight_and_bias_backward(const Launch& l, DType dtype, DType grad_dtype, LtGemm dw,
                              void* dbias, const void* dout, int N, int OC) {
  if (dw.c == nullptr) {  // a weight that is not trained: its bias alone
    if (dbias != nullptr) bias_backward(l, dtype, grad_dtype, dbias, dout, N, OC, l.ws);
    return;
  }
  dw.c_type = to_cuda_dtype(grad_dtype);
  dw.beta = 1.0f;
  if (dbias != nullptr && grad_dtype == DType::kFloat32) {
    float* sums = static_cast<float*>(l.ws);
    dw.bias_grad = sums;
    if (gemm_lt(l, dw)) {
      launch_column_finish<float>(l, static_cast<float*>(dbias), sums, 1, OC);
      return;
    }
  }
  gemm(l, dw.trans_a, dw.trans_b, dw.m, dw.n, dw.k, 1.0f, dw.a, dw.type, dw.lda, dw.b, dw.type,
       dw.ldb, 1.0f, dw.c, dw.c_type, dw.ldc);
  if (dbias != nullptr) bias_backward(l, dtype, grad_dtype, dbias, dout, N, OC, l.ws);
}

std::int64_t matmul_backward_workspace(int N, int OC) {
  return bias_backward_workspace(N, OC);
}

void matmul_backward(const Launch& l, DType dtype, DType grad_dtype, void* dinp, void* dweight,
                     void* dbias, const void* dout, const void* inp, const void* weight, int N,
                     int C, int OC, GradWrite dinp_write) {
  const cudaDataType type = to_cuda_dtype(dtype);
  if (dinp != nullptr) {
    const float beta = dinp_write == GradWrite::kOverwrite ? 0.0f : 1.0f;
    gemm(l, false, true, N, C, OC, 1.0f, dout, type, OC, weight, type, OC, beta, dinp, type, C);
  }
  // dweight (C, OC) += inp^T @ dout: dout is the GEMM's b.
  LtGemm dw = lt_gemm(true, false, C, OC, N, inp, C, dout, OC, dweight, OC, type);
  dw.epilogue = LtEpilogue::kBiasGradFromB;
  weight_and_bias_backward(l, dtype, grad_dtype, dw, dbias, dout, N, OC);
}

}  // namespace zrt::kernels::cuda
