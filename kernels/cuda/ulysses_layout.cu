#include "kernels/cuda/ulysses_layout.cuh"

#include "kernels/cuda/device_math.cuh"
#include "runtime/device/cuda_device.h"

namespace zrt::kernels::cuda {

namespace {

constexpr int kThreads = 256;
using I64 = long;  // the kernels' element indices (64-bit on every CUDA host)

__device__ __forceinline__ I64 grid_start() {
  return blockIdx.x * static_cast<I64>(blockDim.x) + threadIdx.x;
}
__device__ __forceinline__ I64 grid_step() {
  return static_cast<I64>(gridDim.x) * blockDim.x;
}

// out (sp,B,Tl,Hd,hs)[j][r][h][x] = in (B,Tl,H,hs)[r][first(j)+h][x], r = b*Tl + t.
template <typename S>
__global__ void ulysses_scatter_heads_kernel(S* out, const S* in, I64 n, int rows, int H, int Hd,
                                             int hs, int heads_per_rank, int group) {
  for (I64 i = grid_start(); i < n; i += grid_step()) {
    const int x = static_cast<int>(i % hs);
    const int h = static_cast<int>((i / hs) % Hd);
    const I64 r = (i / (static_cast<I64>(hs) * Hd)) % rows;
    const int j = static_cast<int>(i / (static_cast<I64>(hs) * Hd * rows));
    const int first = static_cast<int>((static_cast<I64>(j) * heads_per_rank) / group);
    out[i] = in[(r * H + first + h) * hs + x];
  }
}

// din (B,Tl,H,hs)[r][h][x] += sum over j (ascending) of the copies in dout, in fp32.
template <typename S>
__global__ void ulysses_scatter_heads_backward_kernel(S* din, const S* dout, I64 n, int sp,
                                                      int rows, int H, int Hd, int hs,
                                                      int heads_per_rank, int group) {
  for (I64 i = grid_start(); i < n; i += grid_step()) {
    const int x = static_cast<int>(i % hs);
    const int h = static_cast<int>((i / hs) % H);
    const I64 r = i / (static_cast<I64>(hs) * H);
    float sum = ld(din[i]);
    for (int j = 0; j < sp; ++j) {
      const int first = static_cast<int>((static_cast<I64>(j) * heads_per_rank) / group);
      if (h < first || h >= first + Hd) continue;
      sum += ld(dout[((static_cast<I64>(j) * rows + r) * Hd + (h - first)) * hs + x]);
    }
    din[i] = st<S>(sum);
  }
}

// out (B,sp*Tl,E)[b][i*Tl+t][e] = in (sp,B,Tl,E)[i][b][t][e], E = Hd*hs (gather); the inverse
// (scatter) reads and writes the other way round.
template <typename S, bool kGather>
__global__ void ulysses_sequence_kernel(S* out, const S* in, I64 n, int sp, int B, int Tl, I64 E) {
  for (I64 i = grid_start(); i < n; i += grid_step()) {
    // i indexes the (B,sp*Tl,E) layout.
    const I64 e = i % E;
    const I64 tt = (i / E) % (static_cast<I64>(sp) * Tl);
    const I64 b = i / (E * sp * Tl);
    const I64 blk = tt / Tl, t = tt % Tl;
    const I64 o = ((blk * B + b) * Tl + t) * E + e;
    if constexpr (kGather) {
      out[i] = in[o];
    } else {
      out[o] = in[i];
    }
  }
}

// out (B,Tl,sp*Hd,hs)[r][i*Hd+h][x] = in (sp,B,Tl,Hd,hs)[i][r][h][x].
template <typename S>
__global__ void ulysses_gather_heads_kernel(S* out, const S* in, I64 n, int sp, int rows, int Hd,
                                            int hs) {
  for (I64 i = grid_start(); i < n; i += grid_step()) {
    const I64 x = i % hs;
    const I64 hh = (i / hs) % (static_cast<I64>(sp) * Hd);
    const I64 r = i / (static_cast<I64>(hs) * sp * Hd);
    const I64 blk = hh / Hd, h = hh % Hd;
    out[i] = in[((blk * rows + r) * Hd + h) * hs + x];
  }
}

}  // namespace

void ulysses_scatter_heads(const Launch& l, DType dtype, void* out, const void* in, int sp, int B,
                           int Tl, int H, int Hd, int hs, int heads_per_rank, int group) {
  const I64 rows = static_cast<I64>(B) * Tl;
  const I64 n = sp * rows * Hd * hs;
  if (n == 0) return;
  with_storage(dtype, [&](auto s) {
    using S = typename decltype(s)::type;
    ulysses_scatter_heads_kernel<S><<<blocks_for(n, kThreads), kThreads, 0, l.stream>>>(
        static_cast<S*>(out), static_cast<const S*>(in), n, static_cast<int>(rows), H, Hd, hs,
        heads_per_rank, group);
    ZRT_CUDA_LAUNCH_CHECK();
  });
}

void ulysses_scatter_heads_backward(const Launch& l, DType dtype, void* din, const void* dout,
                                    int sp, int B, int Tl, int H, int Hd, int hs,
                                    int heads_per_rank, int group) {
  const I64 rows = static_cast<I64>(B) * Tl;
  const I64 n = rows * H * hs;
  if (n == 0) return;
  with_storage(dtype, [&](auto s) {
    using S = typename decltype(s)::type;
    ulysses_scatter_heads_backward_kernel<S><<<blocks_for(n, kThreads), kThreads, 0, l.stream>>>(
        static_cast<S*>(din), static_cast<const S*>(dout), n, sp, static_cast<int>(rows), H, Hd, hs,
        heads_per_rank, group);
    ZRT_CUDA_LAUNCH_CHECK();
  });
}

void ulysses_gather_sequence(const Launch& l, DType dtype, void* out, const void* in, int sp, int B,
                             int Tl, int Hd, int hs) {
  const I64 E = static_cast<I64>(Hd) * hs;
  const I64 n = static_cast<I64>(B) * sp * Tl * E;
  if (n == 0) return;
  with_storage(dtype, [&](auto s) {
    using S = typename decltype(s)::type;
    ulysses_sequence_kernel<S, true><<<blocks_for(n, kThreads), kThreads, 0, l.stream>>>(
        static_cast<S*>(out), static_cast<const S*>(in), n, sp, B, Tl, E);
    ZRT_CUDA_LAUNCH_CHECK();
  });
}

void ulysses_scatter_sequence(const Launch& l, DType dtype, void* out, const void* in, int sp,
                              int B, int Tl, int Hd, int hs) {
  const I64 E = static_cast<I64>(Hd) * hs;
  const I64 n = static_cast<I64>(B) * sp * Tl * E;
  if (n == 0) return;
  with_storage(dtype, [&](auto s) {
    using S = typename decltype(s)::type;
    ulysses_sequence_kernel<S, false><<<blocks_for(n, kThreads), kThreads, 0, l.stream>>>(
        static_cast<S*>(out), static_cast<const S*>(in), n, sp, B, Tl, E);
    ZRT_CUDA_LAUNCH_CHECK();
  });
}

void ulysses_gather_heads(const Launch& l, DType dtype, void* out, const void* in, int sp, int B,
                          int Tl, int Hd, int hs) {
  const I64 rows = static_cast<I64>(B) * Tl;
  const I64 n = rows * sp * Hd * hs;
  if (n == 0) return;
  with_storage(dtype, [&](auto s) {
    using S = typename decltype(s)::type;
    ulysses_gather_heads_kernel<S><<<blocks_for(n, kThreads), kThreads, 0, l.stream>>>(
        static_cast<S*>(out), static_cast<const S*>(in), n, sp, static_cast<int>(rows), Hd, hs);
    ZRT_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace zrt::kernels::cuda
