#include "kernels/cuda/layernorm.cuh"
#include "kernels/cuda/rmsnorm.cuh"

#include <cstdint>

#include "kernels/cuda/column_sums.cuh"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/residual.cuh"
#include "kernels/cuda/row_pieces.cuh"
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

// The vector variants for 16-bit rows with C % 8 == 0 and C <= 256 * NV (Llama widths 576 to
// 4096, kernels/cuda/row_pieces.cuh): each lane moves its pieces with 16-byte loads; the
// forward loads each once and keeps it as loaded (4 registers a piece, so 4096-wide rows fit),
// converting to fp32 per pass. The scalar kernels read every element two or three times, 2 bytes
// at a time (the pattern that ran LayerNorm's dinp at a sixteenth of an H100's bandwidth).
//
// With `b`: res = a + b first, rounded and stored as residual_forward stores it, then normalized
// (residual_rmsnorm_forward); without, `a` is the input and `res` is not written.
template <typename S, int NV>
__global__ void rmsnorm_forward_vec_kernel(S* out, float* rstd, S* res, const S* a, const S* b,
                                           const S* weight, int N, int C, float eps) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const std::int64_t off = static_cast<std::int64_t>(row) * C;
  uint4 x[NV];
  load_row_pieces<S, NV>(x, res, a, b, off, C, lane);
  float sumsq = 0.0f;
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    if ((lane + 32 * j) * kPiece >= C) continue;
#pragma unroll
    for (int e = 0; e < kPiece; ++e) {
      const float v = piece_at<S>(x[j], e);
      sumsq += v * v;
    }
  }
  const float s = 1.0f / sqrtf(warp_sum(sumsq) / C + eps);
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int c0 = (lane + 32 * j) * kPiece;
    if (c0 >= C) continue;
    const uint4 xw = *reinterpret_cast<const uint4*>(weight + c0);
    uint4 xo;
    S* po = reinterpret_cast<S*>(&xo);
#pragma unroll
    for (int e = 0; e < kPiece; ++e) po[e] = st<S>(piece_at<S>(x[j], e) * s * piece_at<S>(xw, e));
    *reinterpret_cast<uint4*>(out + off + c0) = xo;
  }
  if (lane == 0) rstd[row] = s;
}

// rmsnorm_dinp_kernel's arithmetic with 16-byte loads in both passes; the second reads the row
// again (from L1: the warp's own row, just read) rather than holding it, since holding both
// rows as fp32, which is what the compiler makes of bf16 pieces, took up to 255 registers and
// spilled at C = 4096 (ptxas, sm_90); this form takes 32-46 and does not spill.
template <typename S, int NV>
__global__ void rmsnorm_dinp_vec_kernel(S* dinp, const S* dout, const S* inp, const S* weight,
                                        const float* rstd, int N, int C) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const std::int64_t off = static_cast<std::int64_t>(row) * C;
  const float s = rstd[row];
  float gn_sum = 0.0f;
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int c0 = (lane + 32 * j) * kPiece;
    if (c0 >= C) continue;
    const uint4 xi = *reinterpret_cast<const uint4*>(inp + off + c0);
    const uint4 xo = *reinterpret_cast<const uint4*>(dout + off + c0);
    const uint4 xw = *reinterpret_cast<const uint4*>(weight + c0);
#pragma unroll
    for (int e = 0; e < kPiece; ++e) {
      gn_sum += piece_at<S>(xo, e) * piece_at<S>(xw, e) * (piece_at<S>(xi, e) * s);
    }
  }
  const float gn_mean = warp_sum(gn_sum) / C;
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int c0 = (lane + 32 * j) * kPiece;
    if (c0 >= C) continue;
    const uint4 xi = *reinterpret_cast<const uint4*>(inp + off + c0);
    const uint4 xo = *reinterpret_cast<const uint4*>(dout + off + c0);
    const uint4 xw = *reinterpret_cast<const uint4*>(weight + c0);
    uint4 xd = *reinterpret_cast<const uint4*>(dinp + off + c0);
    S* pd = reinterpret_cast<S*>(&xd);
#pragma unroll
    for (int e = 0; e < kPiece; ++e) {
      const float norm = piece_at<S>(xi, e) * s;
      const float g = piece_at<S>(xo, e) * piece_at<S>(xw, e);
      pd[e] = st<S>(ld(pd[e]) + (g - norm * gn_mean) * s);
    }
    *reinterpret_cast<uint4*>(dinp + off + c0) = xd;
  }
}

// Launches rmsnorm_forward_vec_kernel when the storage, shape and pointers allow; else false.
template <typename S>
bool launch_forward_vec(const Launch& l, S* out, float* rstd, S* res, const S* a, const S* b,
                        const S* weight, int N, int C, float eps) {
  if constexpr (sizeof(S) != 2) {
    return false;
  } else {
    if (!aligned16(out) || !aligned16(a) || !aligned16(weight) ||
        (b != nullptr && (!aligned16(b) || !aligned16(res)))) {
      return false;
    }
    const unsigned blocks = (N + kRowsPerBlock - 1) / kRowsPerBlock;
    const bool launched = with_row_pieces(C, [&](auto nv) {
      rmsnorm_forward_vec_kernel<S, decltype(nv)::value>
          <<<blocks, kThreads, 0, l.stream>>>(out, rstd, res, a, b, weight, N, C, eps);
    });
    if (launched) ZRT_CUDA_LAUNCH_CHECK();
    return launched;
  }
}

template <typename S>
bool launch_dinp_vec(const Launch& l, S* dinp, const S* dout, const S* inp, const S* weight,
                     const float* rstd, int N, int C) {
  if constexpr (sizeof(S) != 2) {
    return false;
  } else {
    if (!aligned16(dinp) || !aligned16(dout) || !aligned16(inp) || !aligned16(weight)) {
      return false;
    }
    const unsigned blocks = (N + kRowsPerBlock - 1) / kRowsPerBlock;
    const bool launched = with_row_pieces(C, [&](auto nv) {
      rmsnorm_dinp_vec_kernel<S, decltype(nv)::value>
          <<<blocks, kThreads, 0, l.stream>>>(dinp, dout, inp, weight, rstd, N, C);
    });
    if (launched) ZRT_CUDA_LAUNCH_CHECK();
    return launched;
  }
}

// Pass 1: partial column sums of dout*norm over a chunk of kColumnSumRows rows.
template <typename S>
__global__ void rmsnorm_partials_kernel(float* part, const S* dout, const S* inp, const float* rstd,
                                        int N, int C, int chunks) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  for (int chunk = blockIdx.y; chunk < chunks; chunk += gridDim.y) {  // column_chunk_blocks
    const int r0 = chunk * kColumnSumRows;
    const int r1 = min(N, r0 + kColumnSumRows);
    float dw = 0.0f;
    for (int r = r0; r < r1; ++r) {
      const std::int64_t i = static_cast<std::int64_t>(r) * C + c;
      dw += ld(dout[i]) * (ld(inp[i]) * rstd[r]);
    }
    part[static_cast<std::int64_t>(chunk) * C + c] = dw;
  }
}

// Pass 2: each column's chunks (column_sums.cuh's order), accumulated into the gradient.
template <typename G>
__global__ void rmsnorm_finish_kernel(G* dweight, const float* part, int chunks, int C) {
  __shared__ float slice[kFinishSlices][kFinishColumns];
  const float dw = finish_column_sum(part, chunks, C, slice);
  const int c = blockIdx.x * kFinishColumns + threadIdx.x;
  if (threadIdx.y == 0 && c < C) dweight[c] = st<G>(ld(dweight[c]) + dw);
}

int chunks_of(int N) {
  return (N + kColumnSumRows - 1) / kColumnSumRows;
}

}  // namespace

void rmsnorm_forward(const Launch& l, DType dtype, void* out, float* rstd, const void* inp,
                     const void* weight, int N, int C, double eps) {
  if (N <= 0) return;
  with_storage(dtype, [&](auto s) {
    using S = typename decltype(s)::type;
    if (launch_forward_vec<S>(l, static_cast<S*>(out), rstd, nullptr, static_cast<const S*>(inp),
                              nullptr, static_cast<const S*>(weight), N, C,
                              static_cast<float>(eps))) {
      return;
    }
    rmsnorm_forward_kernel<S><<<(N + kRowsPerBlock - 1) / kRowsPerBlock, kThreads, 0, l.stream>>>(
        static_cast<S*>(out), rstd, static_cast<const S*>(inp), static_cast<const S*>(weight), N, C,
        static_cast<float>(eps));
    ZRT_CUDA_LAUNCH_CHECK();
  });
}

void residual_rmsnorm_forward(const Launch& l, DType dtype, void* res, void* out, float* rstd,
                              const void* a, const void* b, const void* weight, int N, int C,
                              double eps) {
  if (N <= 0) return;
  bool fused = false;
  with_storage(dtype, [&](auto s) {
    using S = typename decltype(s)::type;
    fused = launch_forward_vec<S>(l, static_cast<S*>(out), rstd, static_cast<S*>(res),
                                  static_cast<const S*>(a), static_cast<const S*>(b),
                                  static_cast<const S*>(weight), N, C, static_cast<float>(eps));
  });
  if (fused) return;
  residual_forward(l, dtype, res, a, b, static_cast<std::int64_t>(N) * C);
  rmsnorm_forward(l, dtype, out, rstd, res, weight, N, C, eps);
}

std::int64_t rmsnorm_backward_workspace(int N, int C) {
  return static_cast<std::int64_t>(chunks_of(N)) * C * static_cast<std::int64_t>(sizeof(float));
}

void rmsnorm_backward(const Launch& l, DType dtype, DType grad_dtype, void* dinp, void* dweight,
                      const void* dout, const void* inp, const void* weight, const float* rstd,
                      int N, int C) {
  if (N <= 0) return;  // no rows: nothing to add (and a grid of 0 chunks would not launch)
  const int chunks = chunks_of(N);
  float* part = static_cast<float*>(l.ws);
  with_storage_grad(dtype, grad_dtype, [&](auto s, auto g) {
    using S = typename decltype(s)::type;
    using G = typename decltype(g)::type;
    if (!launch_dinp_vec<S>(l, static_cast<S*>(dinp), static_cast<const S*>(dout),
                            static_cast<const S*>(inp), static_cast<const S*>(weight), rstd, N,
                            C)) {
      rmsnorm_dinp_kernel<S><<<(N + kRowsPerBlock - 1) / kRowsPerBlock, kThreads, 0, l.stream>>>(
          static_cast<S*>(dinp), static_cast<const S*>(dout), static_cast<const S*>(inp),
          static_cast<const S*>(weight), rstd, N, C);
      ZRT_CUDA_LAUNCH_CHECK();
    }
    if (dweight == nullptr) return;  // a frozen weight: no column sums
    const dim3 grid((C + kColumnThreads - 1) / kColumnThreads, column_chunk_blocks(chunks));
    rmsnorm_partials_kernel<S><<<grid, kColumnThreads, 0, l.stream>>>(
        part, static_cast<const S*>(dout), static_cast<const S*>(inp), rstd, N, C, chunks);
    ZRT_CUDA_LAUNCH_CHECK();
    rmsnorm_finish_kernel<G><<<finish_blocks(C), finish_block(), 0, l.stream>>>(
        static_cast<G*>(dweight), part, chunks, C);
    ZRT_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace zrt::kernels::cuda
