#include "kernels/cuda/layernorm.cuh"
#include "kernels/cuda/rmsnorm.cuh"

#include "kernels/cuda/device_math.cuh"
#include "runtime/device/cuda_device.h"

namespace zrt::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kRowsPerBlock = kThreads / 32;  // one warp per row
constexpr int kColumnThreads = 128;

template <typename S>
__global__ void rmsnorm_forward_kernel(S* out, float* rstd, const S* inp, const S* weight, int N,
                                       int C, float eps) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const S* x = inp + static_cast<std::int64_t>(row) * C;
  S* o = out + static_cast<std::int64_t>(row) * C;
  float sumsq = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float v = ld(x[c]);
    sumsq += v * v;
  }
  const float s = 1.0f / sqrtf(warp_sum(sumsq) / C + eps);
  for (int c = lane; c < C; c += 32) o[c] = st<S>(ld(x[c]) * s * ld(weight[c]));
  if (lane == 0) rstd[row] = s;
}

template <typename S>
__global__ void rmsnorm_dinp_kernel(S* dinp, const S* dout, const S* inp, const S* weight,
                                    const float* rstd, int N, int C) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const std::int64_t off = static_cast<std::int64_t>(row) * C;
  const float s = rstd[row];
  float gn_sum = 0.0f;
  for (int c = lane; c < C; c += 32) {
    gn_sum += ld(dout[off + c]) * ld(weight[c]) * (ld(inp[off + c]) * s);
  }
  const float gn_mean = warp_sum(gn_sum) / C;
  for (int c = lane; c < C; c += 32) {
    const float norm = ld(inp[off + c]) * s;
    const float g = ld(dout[off + c]) * ld(weight[c]);
    dinp[off + c] = st<S>(ld(dinp[off + c]) + (g - norm * gn_mean) * s);
  }
}

// Pass 1: partial column sums of dout*norm over a chunk of kColumnSumRows rows.
template <typename S>
__global__ void rmsnorm_partials_kernel(float* part, const S* dout, const S* inp, const float* rstd,
                                        int N, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int chunk = blockIdx.y;
  if (c >= C) return;
  const int r0 = chunk * kColumnSumRows;
  const int r1 = min(N, r0 + kColumnSumRows);
  float dw = 0.0f;
  for (int r = r0; r < r1; ++r) {
    const std::int64_t i = static_cast<std::int64_t>(r) * C + c;
    dw += ld(dout[i]) * (ld(inp[i]) * rstd[r]);
  }
  part[static_cast<std::int64_t>(chunk) * C + c] = dw;
}

// Pass 2: the chunks in order, accumulated into the gradient.
template <typename G>
__global__ void rmsnorm_finish_kernel(G* dweight, const float* part, int chunks, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float dw = 0.0f;
  for (int k = 0; k < chunks; ++k) dw += part[static_cast<std::int64_t>(k) * C + c];
  dweight[c] = st<G>(ld(dweight[c]) + dw);
}

int chunks_of(int N) {
  return (N + kColumnSumRows - 1) / kColumnSumRows;
}

}  // namespace

void rmsnorm_forward(const Launch& l, DType dtype, void* out, float* rstd, const void* inp,
                     const void* weight, int N, int C, double eps) {
  with_storage(dtype, [&](auto s) {
    using S = typename decltype(s)::type;
    rmsnorm_forward_kernel<S><<<(N + kRowsPerBlock - 1) / kRowsPerBlock, kThreads, 0, l.stream>>>(
        static_cast<S*>(out), rstd, static_cast<const S*>(inp), static_cast<const S*>(weight), N, C,
        static_cast<float>(eps));
    ZRT_CUDA_LAUNCH_CHECK();
  });
}

std::int64_t rmsnorm_backward_workspace(int N, int C) {
  return static_cast<std::int64_t>(chunks_of(N)) * C * static_cast<std::int64_t>(sizeof(float));
}

void rmsnorm_backward(const Launch& l, DType dtype, DType grad_dtype, void* dinp, void* dweight,
                      const void* dout, const void* inp, const void* weight, const float* rstd,
                      int N, int C) {
  const int chunks = chunks_of(N);
  float* part = static_cast<float*>(l.ws);
  with_storage_grad(dtype, grad_dtype, [&](auto s, auto g) {
    using S = typename decltype(s)::type;
    using G = typename decltype(g)::type;
    rmsnorm_dinp_kernel<S><<<(N + kRowsPerBlock - 1) / kRowsPerBlock, kThreads, 0, l.stream>>>(
        static_cast<S*>(dinp), static_cast<const S*>(dout), static_cast<const S*>(inp),
        static_cast<const S*>(weight), rstd, N, C);
    ZRT_CUDA_LAUNCH_CHECK();
    const dim3 grid((C + kColumnThreads - 1) / kColumnThreads, chunks);
    rmsnorm_partials_kernel<S><<<grid, kColumnThreads, 0, l.stream>>>(
        part, static_cast<const S*>(dout), static_cast<const S*>(inp), rstd, N, C);
    ZRT_CUDA_LAUNCH_CHECK();
    rmsnorm_finish_kernel<G>
        <<<(C + kColumnThreads - 1) / kColumnThreads, kColumnThreads, 0, l.stream>>>(
            static_cast<G*>(dweight), part, chunks, C);
    ZRT_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace zrt::kernels::cuda
