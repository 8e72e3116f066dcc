#include "kernels/cuda/layernorm.cuh"

#include <algorithm>
#include <cstdint>
#include <type_traits>

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
constexpr float kEps = 1e-5f;

template <typename S>
__global__ void layernorm_forward_kernel(S* out, float* mean, float* rstd, const S* inp,
                                         const S* weight, const S* bias, int N, int C) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const S* x = inp + static_cast<std::int64_t>(row) * C;
  S* o = out + static_cast<std::int64_t>(row) * C;
  float sum = 0.0f;
  for (int c = lane; c < C; c += 32) sum += ld(x[c]);
  const float m = warp_sum(sum) / C;
  float var = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float d = ld(x[c]) - m;
    var += d * d;
  }
  const float s = 1.0f / sqrtf(warp_sum(var) / C + kEps);
  for (int c = lane; c < C; c += 32) {
    const float norm = (ld(x[c]) - m) * s;
    o[c] = st<S>(norm * ld(weight[c]) + ld(bias[c]));
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

// layernorm_forward_kernel for 16-bit rows with C % 8 == 0 and C <= 256 * NV (GPT-2's 768 to
// 1600, a 6.7B GPT's 4096; kernels/cuda/row_pieces.cuh), and with `b` the residual add before
// it (res = a + b, stored rounded as residual_forward stores it, then normalized): each lane
// loads its pieces once with 16-byte loads and keeps them as loaded (4 registers a piece) for
// the mean, the variance and the output (the scalar kernel reads every element three times, 2
// bytes at a time). Without `b`, `a` is the input and `res` is not written.
template <typename S, int NV>
__global__ void layernorm_forward_vec_kernel(S* out, float* mean, float* rstd, S* res, const S* a,
                                             const S* b, const S* weight, const S* bias, int N,
                                             int C) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const std::int64_t off = static_cast<std::int64_t>(row) * C;
  uint4 x[NV];
  load_row_pieces<S, NV>(x, res, a, b, off, C, lane);
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    if ((lane + 32 * j) * kPiece >= C) continue;
#pragma unroll
    for (int e = 0; e < kPiece; ++e) sum += piece_at<S>(x[j], e);
  }
  const float m = warp_sum(sum) / C;
  float var = 0.0f;
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    if ((lane + 32 * j) * kPiece >= C) continue;
#pragma unroll
    for (int e = 0; e < kPiece; ++e) {
      const float d = piece_at<S>(x[j], e) - m;
      var += d * d;
    }
  }
  const float s = 1.0f / sqrtf(warp_sum(var) / C + kEps);
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int c0 = (lane + 32 * j) * kPiece;
    if (c0 >= C) continue;
    const uint4 xw = *reinterpret_cast<const uint4*>(weight + c0);
    const uint4 xbias = *reinterpret_cast<const uint4*>(bias + c0);
    uint4 xo;
    S* po = reinterpret_cast<S*>(&xo);
#pragma unroll
    for (int e = 0; e < kPiece; ++e) {
      po[e] = st<S>((piece_at<S>(x[j], e) - m) * s * piece_at<S>(xw, e) + piece_at<S>(xbias, e));
    }
    *reinterpret_cast<uint4*>(out + off + c0) = xo;
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

template <typename S>
__global__ void layernorm_dinp_kernel(S* dinp, const S* dout, const S* inp, const S* weight,
                                      const float* mean, const float* rstd, int N, int C) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const std::int64_t off = static_cast<std::int64_t>(row) * C;
  const float m = mean[row];
  const float s = rstd[row];
  float g_sum = 0.0f, gn_sum = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float norm = (ld(inp[off + c]) - m) * s;
    const float g = ld(dout[off + c]) * ld(weight[c]);
    g_sum += g;
    gn_sum += g * norm;
  }
  const float g_mean = warp_sum(g_sum) / C;
  const float gn_mean = warp_sum(gn_sum) / C;
  for (int c = lane; c < C; c += 32) {
    const float norm = (ld(inp[off + c]) - m) * s;
    const float g = ld(dout[off + c]) * ld(weight[c]);
    dinp[off + c] = st<S>(ld(dinp[off + c]) + (g - g_mean - norm * gn_mean) * s);
  }
}

// layernorm_dinp_kernel for 16-bit rows of C = 256 * NV: each lane loads its 8-element pieces of
// inp, dout and weight once, with 16-byte loads, and keeps them in registers for both passes
// (the scalar kernel reads every element twice, 2 bytes at a time, and ran at a sixteenth of the
// memory bandwidth on an H100 at GPT-2's C = 768).
template <typename S, int NV>
__global__ void layernorm_dinp_vec_kernel(S* dinp, const S* dout, const S* inp, const S* weight,
                                          const float* mean, const float* rstd, int N, int C) {
  constexpr int kVec = 16 / sizeof(S);
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const std::int64_t off = static_cast<std::int64_t>(row) * C;
  const float m = mean[row];
  const float s = rstd[row];
  float g[NV][kVec], norm[NV][kVec];
  float g_sum = 0.0f, gn_sum = 0.0f;
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int c0 = (lane + 32 * j) * kVec;
    const uint4 xi = *reinterpret_cast<const uint4*>(inp + off + c0);
    const uint4 xo = *reinterpret_cast<const uint4*>(dout + off + c0);
    const uint4 xw = *reinterpret_cast<const uint4*>(weight + c0);
    const S* pi = reinterpret_cast<const S*>(&xi);
    const S* po = reinterpret_cast<const S*>(&xo);
    const S* pw = reinterpret_cast<const S*>(&xw);
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      norm[j][e] = (ld(pi[e]) - m) * s;
      g[j][e] = ld(po[e]) * ld(pw[e]);
      g_sum += g[j][e];
      gn_sum += g[j][e] * norm[j][e];
    }
  }
  const float g_mean = warp_sum(g_sum) / C;
  const float gn_mean = warp_sum(gn_sum) / C;
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int c0 = (lane + 32 * j) * kVec;
    uint4 xd = *reinterpret_cast<const uint4*>(dinp + off + c0);
    S* pd = reinterpret_cast<S*>(&xd);
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      pd[e] = st<S>(ld(pd[e]) + (g[j][e] - g_mean - norm[j][e] * gn_mean) * s);
    }
    *reinterpret_cast<uint4*>(dinp + off + c0) = xd;
  }
}

// The whole backward of 16-bit rows of C = 256 * NV, NV <= kFusedMaxNV, in one read of dout
// and inp: layernorm_dinp_vec_kernel's input gradient, and the weight and bias gradients'
// partial column sums of the block's chunk of kFusedRows rows (warp w takes rows w, w + 8, ...
// of the chunk, each lane keeping its columns' sums in registers; then the warps' sums are
// added in warp order in shared memory), one row of part_w / part_b per chunk, which
// layernorm_finish_kernel sums. The two-pass path read dout and inp a second time for the
// sums, on 768 threads a chunk column.
constexpr int kFusedRows = 32;
constexpr int kFusedMaxNV = 4;  // C <= 1024: the sums' 2 x 8 NV registers a lane stay affordable

template <typename S, int NV>
__global__ void __launch_bounds__(kThreads)
    layernorm_backward_vec_kernel(S* dinp, float* part_w, float* part_b, const S* dout,
                                  const S* inp, const S* weight, const float* mean,
                                  const float* rstd, int N, int C) {
  constexpr int kVec = 16 / sizeof(S);
  __shared__ float sum_w[256 * kFusedMaxNV], sum_b[256 * kFusedMaxNV];
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int chunk = blockIdx.x;
  float dw[NV][kVec], db[NV][kVec];
  uint4 xw[NV];
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    xw[j] = *reinterpret_cast<const uint4*>(weight + (lane + 32 * j) * kVec);
#pragma unroll
    for (int e = 0; e < kVec; ++e) dw[j][e] = db[j][e] = 0.0f;
  }
  for (int i = 0; i < kFusedRows / kRowsPerBlock; ++i) {
    const int row = chunk * kFusedRows + i * kRowsPerBlock + warp;
    if (row >= N) break;  // the warp's remaining rows are past N too
    const std::int64_t off = static_cast<std::int64_t>(row) * C;
    const float m = mean[row];
    const float s = rstd[row];
    // The row's pieces as loaded (dinp's too, before it is needed): the products are
    // recomputed in the second pass rather than kept, which leaves registers for the sums.
    uint4 xi[NV], xo[NV], xd[NV];
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      const int c0 = (lane + 32 * j) * kVec;
      xi[j] = *reinterpret_cast<const uint4*>(inp + off + c0);
      xo[j] = *reinterpret_cast<const uint4*>(dout + off + c0);
      xd[j] = *reinterpret_cast<const uint4*>(dinp + off + c0);
    }
    float g_sum = 0.0f, gn_sum = 0.0f;
#pragma unroll
    for (int j = 0; j < NV; ++j) {
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        const float dy = piece_at<S>(xo[j], e);
        const float norm = (piece_at<S>(xi[j], e) - m) * s;
        const float g = dy * piece_at<S>(xw[j], e);
        g_sum += g;
        gn_sum += g * norm;
        dw[j][e] += dy * norm;
        db[j][e] += dy;
      }
    }
    const float g_mean = warp_sum(g_sum) / C;
    const float gn_mean = warp_sum(gn_sum) / C;
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      S* pd = reinterpret_cast<S*>(&xd[j]);
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        const float norm = (piece_at<S>(xi[j], e) - m) * s;
        const float g = piece_at<S>(xo[j], e) * piece_at<S>(xw[j], e);
        pd[e] = st<S>(ld(pd[e]) + (g - g_mean - norm * gn_mean) * s);
      }
      *reinterpret_cast<uint4*>(dinp + off + (lane + 32 * j) * kVec) = xd[j];
    }
  }
  // The warps' sums in warp order: each warp's turn ends at a barrier every thread reaches.
  for (int w = 0; w < kRowsPerBlock; ++w) {
    if (warp == w) {
#pragma unroll
      for (int j = 0; j < NV; ++j) {
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          const int c = (lane + 32 * j) * kVec + e;
          sum_w[c] = w == 0 ? dw[j][e] : sum_w[c] + dw[j][e];
          sum_b[c] = w == 0 ? db[j][e] : sum_b[c] + db[j][e];
        }
      }
    }
    __syncthreads();
  }
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    part_w[static_cast<std::int64_t>(chunk) * C + c] = sum_w[c];
    part_b[static_cast<std::int64_t>(chunk) * C + c] = sum_b[c];
  }
}

// Calls f(std::integral_constant<int, nv>) for nv in 1..8.
template <typename F>
void with_nv(int nv, F&& f) {
  switch (nv) {
    case 1:
      return f(std::integral_constant<int, 1>{});
    case 2:
      return f(std::integral_constant<int, 2>{});
    case 3:
      return f(std::integral_constant<int, 3>{});
    case 4:
      return f(std::integral_constant<int, 4>{});
    case 5:
      return f(std::integral_constant<int, 5>{});
    case 6:
      return f(std::integral_constant<int, 6>{});
    case 7:
      return f(std::integral_constant<int, 7>{});
    default:
      return f(std::integral_constant<int, 8>{});
  }
}

// Launches the register-resident dinp kernel when the shape and pointers allow; else false.
template <typename S>
bool launch_dinp_vec(const Launch& l, S* dinp, const S* dout, const S* inp, const S* weight,
                     const float* mean, const float* rstd, int N, int C) {
  if constexpr (sizeof(S) != 2) {
    return false;
  } else {
    constexpr int kPerVector = 32 * 8;  // elements one 16-byte load per lane covers
    if (C % kPerVector != 0 || C / kPerVector > 8 || !aligned16(dinp) || !aligned16(dout) ||
        !aligned16(inp) || !aligned16(weight)) {
      return false;
    }
    const unsigned blocks = (N + kRowsPerBlock - 1) / kRowsPerBlock;
    with_nv(C / kPerVector, [&](auto nv) {
      layernorm_dinp_vec_kernel<S, decltype(nv)::value>
          <<<blocks, kThreads, 0, l.stream>>>(dinp, dout, inp, weight, mean, rstd, N, C);
    });
    ZRT_CUDA_LAUNCH_CHECK();
    return true;
  }
}

int fused_chunks_of(int N) {
  return (N + kFusedRows - 1) / kFusedRows;
}

// Whether the one-pass backward takes these rows (16-bit, C = 256 NV with NV <= kFusedMaxNV,
// every row pointer 16-byte aligned).
template <typename S>
bool fused_backward_fits(const void* dinp, const void* dout, const void* inp, const void* weight,
                         int C) {
  constexpr int kPerVector = 32 * 8;
  return sizeof(S) == 2 && C % kPerVector == 0 && C / kPerVector >= 1 &&
         C / kPerVector <= kFusedMaxNV && aligned16(dinp) && aligned16(dout) && aligned16(inp) &&
         aligned16(weight);
}

template <typename S>
void launch_backward_vec(const Launch& l, S* dinp, float* part_w, float* part_b, const S* dout,
                         const S* inp, const S* weight, const float* mean, const float* rstd, int N,
                         int C) {
  with_nv(C / (32 * 8), [&](auto nv) {
    if constexpr (decltype(nv)::value <= kFusedMaxNV) {
      layernorm_backward_vec_kernel<S, decltype(nv)::value>
          <<<fused_chunks_of(N), kThreads, 0, l.stream>>>(dinp, part_w, part_b, dout, inp, weight,
                                                          mean, rstd, N, C);
    }
  });
  ZRT_CUDA_LAUNCH_CHECK();
}

// Launches layernorm_forward_vec_kernel when the storage, shape and pointers allow (b, res: the
// fused residual add, or null); else false.
template <typename S>
bool launch_forward_vec(const Launch& l, S* out, float* mean, float* rstd, S* res, const S* a,
                        const S* b, const S* weight, const S* bias, int N, int C) {
  if constexpr (sizeof(S) != 2) {
    return false;
  } else {
    if (!aligned16(out) || !aligned16(a) || !aligned16(weight) || !aligned16(bias) ||
        (b != nullptr && (!aligned16(b) || !aligned16(res)))) {
      return false;
    }
    const unsigned blocks = (N + kRowsPerBlock - 1) / kRowsPerBlock;
    const bool launched = with_row_pieces(C, [&](auto nv) {
      layernorm_forward_vec_kernel<S, decltype(nv)::value>
          <<<blocks, kThreads, 0, l.stream>>>(out, mean, rstd, res, a, b, weight, bias, N, C);
    });
    if (launched) ZRT_CUDA_LAUNCH_CHECK();
    return launched;
  }
}

// Pass 1: partial column sums of dout*norm and dout over a chunk of kColumnSumRows rows.
template <typename S>
__global__ void layernorm_partials_kernel(float* part_w, float* part_b, const S* dout, const S* inp,
                                          const float* mean, const float* rstd, int N, int C,
                                          int chunks) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  for (int chunk = blockIdx.y; chunk < chunks; chunk += gridDim.y) {  // column_chunk_blocks
    const int r0 = chunk * kColumnSumRows;
    const int r1 = min(N, r0 + kColumnSumRows);
    float dw = 0.0f, db = 0.0f;
    for (int r = r0; r < r1; ++r) {
      const std::int64_t i = static_cast<std::int64_t>(r) * C + c;
      const float dy = ld(dout[i]);
      dw += dy * ((ld(inp[i]) - mean[r]) * rstd[r]);
      db += dy;
    }
    part_w[static_cast<std::int64_t>(chunk) * C + c] = dw;
    part_b[static_cast<std::int64_t>(chunk) * C + c] = db;
  }
}

// Pass 2: per column, the chunks' partial sums (column_sums.cuh's order) accumulated into the
// gradients.
template <typename G>
__global__ void layernorm_finish_kernel(G* dweight, G* dbias, const float* part_w,
                                        const float* part_b, int chunks, int C) {
  __shared__ float slice[kFinishSlices][kFinishColumns];
  const float dw = finish_column_sum(part_w, chunks, C, slice);
  const float db = finish_column_sum(part_b, chunks, C, slice);
  const int c = blockIdx.x * kFinishColumns + threadIdx.x;
  if (threadIdx.y != 0 || c >= C) return;
  if (dweight != nullptr) dweight[c] = st<G>(ld(dweight[c]) + dw);
  if (dbias != nullptr) dbias[c] = st<G>(ld(dbias[c]) + db);
}

int chunks_of(int N) {
  return (N + kColumnSumRows - 1) / kColumnSumRows;
}

}  // namespace

void layernorm_forward(const Launch& l, DType dtype, void* out, float* mean, float* rstd,
                       const void* inp, const void* weight, const void* bias, int N, int C) {
  if (N <= 0) return;
  with_storage(dtype, [&](auto s) {
    using S = typename decltype(s)::type;
    if (launch_forward_vec<S>(l, static_cast<S*>(out), mean, rstd, nullptr,
                              static_cast<const S*>(inp), nullptr, static_cast<const S*>(weight),
                              static_cast<const S*>(bias), N, C)) {
      return;
    }
    layernorm_forward_kernel<S><<<(N + kRowsPerBlock - 1) / kRowsPerBlock, kThreads, 0, l.stream>>>(
        static_cast<S*>(out), mean, rstd, static_cast<const S*>(inp), static_cast<const S*>(weight),
        static_cast<const S*>(bias), N, C);
    ZRT_CUDA_LAUNCH_CHECK();
  });
}

void residual_layernorm_forward(const Launch& l, DType dtype, void* res, void* out, float* mean,
                                float* rstd, const void* a, const void* b, const void* weight,
                                const void* bias, int N, int C) {
  if (N <= 0) return;
  bool fused = false;
  with_storage(dtype, [&](auto s) {
    using S = typename decltype(s)::type;
    fused = launch_forward_vec<S>(l, static_cast<S*>(out), mean, rstd, static_cast<S*>(res),
                                  static_cast<const S*>(a), static_cast<const S*>(b),
                                  static_cast<const S*>(weight), static_cast<const S*>(bias), N, C);
  });
  if (fused) return;
  residual_forward(l, dtype, res, a, b, static_cast<std::int64_t>(N) * C);
  layernorm_forward(l, dtype, out, mean, rstd, res, weight, bias, N, C);
}

// The partial sums of the larger of the two chunkings (the one-pass kernel's kFusedRows rows a
// chunk, the two-pass kernels' kColumnSumRows).
std::int64_t layernorm_backward_workspace(int N, int C) {
  const int chunks = std::max(chunks_of(N), fused_chunks_of(N));
  return 2 * static_cast<std::int64_t>(chunks) * C * static_cast<std::int64_t>(sizeof(float));
}

void layernorm_backward(const Launch& l, DType dtype, DType grad_dtype, void* dinp, void* dweight,
                        void* dbias, const void* dout, const void* inp, const void* weight,
                        const float* mean, const float* rstd, int N, int C) {
  if (N <= 0) return;  // no rows: nothing to add (and a grid of 0 chunks would not launch)
  const bool sums = dweight != nullptr || dbias != nullptr;  // both frozen: no column sums
  with_storage_grad(dtype, grad_dtype, [&](auto s, auto g) {
    using S = typename decltype(s)::type;
    using G = typename decltype(g)::type;
    const auto finish = [&](const float* part_w, const float* part_b, int chunks) {
      layernorm_finish_kernel<G><<<finish_blocks(C), finish_block(), 0, l.stream>>>(
          static_cast<G*>(dweight), static_cast<G*>(dbias), part_w, part_b, chunks, C);
      ZRT_CUDA_LAUNCH_CHECK();
    };
    if constexpr (sizeof(S) == 2) {  // the one-pass kernel is built for 16-bit rows only
      if (sums && fused_backward_fits<S>(dinp, dout, inp, weight, C)) {
        const int chunks = fused_chunks_of(N);
        float* part_w = static_cast<float*>(l.ws);
        float* part_b = part_w + static_cast<std::int64_t>(chunks) * C;
        launch_backward_vec<S>(l, static_cast<S*>(dinp), part_w, part_b,
                               static_cast<const S*>(dout), static_cast<const S*>(inp),
                               static_cast<const S*>(weight), mean, rstd, N, C);
        finish(part_w, part_b, chunks);
        return;
      }
    }
    if (!launch_dinp_vec<S>(l, static_cast<S*>(dinp), static_cast<const S*>(dout),
                            static_cast<const S*>(inp), static_cast<const S*>(weight), mean, rstd,
                            N, C)) {
      layernorm_dinp_kernel<S><<<(N + kRowsPerBlock - 1) / kRowsPerBlock, kThreads, 0, l.stream>>>(
          static_cast<S*>(dinp), static_cast<const S*>(dout), static_cast<const S*>(inp),
          static_cast<const S*>(weight), mean, rstd, N, C);
      ZRT_CUDA_LAUNCH_CHECK();
    }
    if (!sums) return;
    const int chunks = chunks_of(N);
    float* part_w = static_cast<float*>(l.ws);
    float* part_b = part_w + static_cast<std::int64_t>(chunks) * C;
    const dim3 grid((C + kColumnThreads - 1) / kColumnThreads, column_chunk_blocks(chunks));
    layernorm_partials_kernel<S><<<grid, kColumnThreads, 0, l.stream>>>(
        part_w, part_b, static_cast<const S*>(dout), static_cast<const S*>(inp), mean, rstd, N, C,
        chunks);
    ZRT_CUDA_LAUNCH_CHECK();
    finish(part_w, part_b, chunks);
  });
}

}  // namespace zrt::kernels::cuda
