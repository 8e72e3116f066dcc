#include "kernels/cuda/flash_attention.cuh"

#include <mma.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/flash_attention_mma.cuh"
#include "runtime/device/cuda_device.h"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
// A build for an architecture below sm_80 compiles the kernels empty (they need bf16 mma.sync and
// cp.async; the host refuses such a GPU at run time), leaving their helpers unreferenced: the
// device pass must not fail on that (--Werror).
#pragma nv_diag_suppress 177
#endif

namespace zrt::kernels::cuda {

namespace {

using I64 = std::int64_t;
namespace wmma = nvcuda::wmma;

// One block: 4 warps over a tile of 64 rows (queries, or keys for dK/dV), 16 rows per warp, the
// WMMA tile height. Every warp works on its own rows and its own scratch; the block shares only
// the L1 cache that holds the tiles they all read.
constexpr int kTile = 64;
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kHeadSize = 64;
static_assert(kTile == kFlashTile && kHeadSize == kFlashWmmaHeadSize,
              "attention_plan.h plans the shapes these kernels take");
// Scratch row strides, padded off a multiple of 32 banks: fp32 scores and 16-bit probabilities.
constexpr int kScoreLd = kTile + 4;
constexpr int kProbLd = kTile + 8;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr unsigned kFullMask = 0xffffffffu;

template <typename S>
using RowA = wmma::fragment<wmma::matrix_a, 16, 16, 16, S, wmma::row_major>;
template <typename S>
using RowB = wmma::fragment<wmma::matrix_b, 16, 16, 16, S, wmma::row_major>;
// A (keys or queries, d) row-major tile read as matrix_b col_major is its transpose: (d, rows).
template <typename S>
using TransposedB = wmma::fragment<wmma::matrix_b, 16, 16, 16, S, wmma::col_major>;
using Acc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// Packed documents: each kernel is built for kDocs false and true (first_key, device_math.cuh).

// acc (16x16) = rows (16 x HS, A fragments) . tile^T where tile is 16 rows of HS at `tile`
// (row stride ld): scores of 16 rows against 16 keys (or queries).
template <typename S, int HS>
__device__ __forceinline__ void rows_dot_tile(Acc& acc, const RowA<S> (&rows)[HS / 16],
                                              const S* tile, int ld) {
  wmma::fill_fragment(acc, 0.0f);
#pragma unroll
  for (int kk = 0; kk < HS / 16; ++kk) {
    TransposedB<S> b;
    wmma::load_matrix_sync(b, tile + kk * 16, ld);
    wmma::mma_sync(acc, rows[kk], b, acc);
  }
}

// Forward: grid (T/64 query tiles, B*NH). Lane (r, half) keeps row r of its warp's 16 and half
// of that row's HS outputs in registers; the rescaling by exp2(m_old - m_new) happens there. With
// doc_start each warp starts at the key tile holding its first row's document start (the key
// tiles before it are outside all its rows' documents) and masks the keys before each row's.
template <typename S, int HS, bool kDocs>
__global__ void __launch_bounds__(kThreads)
    flash_forward_kernel(S* out, float* lse, const S* qkv, int T, int C, int NH, float scale_log2,
                         const std::int32_t* doc_start, int window) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  static_assert(HS % 16 == 0 && HS <= kTile, "head size: a multiple of 16, at most 64");
  __shared__ __align__(32) float s_scores[kWarps][16 * kScoreLd];
  __shared__ __align__(32) S s_probs[kWarps][16 * kProbLd];
  const int tile = static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x);  // long first
  const int bh = blockIdx.y;
  const int b = bh / NH, h = bh % NH;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r = lane / 2, half = lane % 2;
  const int q0 = tile * kTile + warp * 16;
  const int qrow = q0 + r;
  const int last_key = q0 + 15;  // keys after it are masked for all 16 rows of the warp
  const SequenceKeys docs = sequence_keys<kDocs>(doc_start, window, b, T);
  const int row_first = first_key<kDocs>(docs, qrow);  // keys before it: not in the row's document
  const int warp_first = first_key<kDocs>(docs, q0);   // ... before this one: in none of the 16
  const int ld3 = 3 * C;
  const S* q_base = qkv + static_cast<I64>(b) * T * ld3 + h * HS;
  const S* k_base = q_base + C;
  const S* v_base = q_base + 2 * C;
  float* scores = s_scores[warp];
  S* probs = s_probs[warp];

  RowA<S> q_frag[HS / 16];
#pragma unroll
  for (int kk = 0; kk < HS / 16; ++kk) {
    wmma::load_matrix_sync(q_frag[kk], q_base + static_cast<I64>(q0) * ld3 + kk * 16, ld3);
  }
  float m = -INFINITY, l = 0.0f;
  float o[HS / 2];
#pragma unroll
  for (int i = 0; i < HS / 2; ++i) o[i] = 0.0f;

  // Without documents k0 <= q0 always (a multiple of 64 not past q0 + 15), so each row sees key
  // k0 in every tile it visits and its running max is finite from the first tile on; with them a
  // row may see no key of a tile (its document starts later), which m_ref below handles.
  for (int k0 = warp_first / kTile * kTile; k0 <= last_key; k0 += kTile) {
#pragma unroll
    for (int n = 0; n < kTile / 16; ++n) {
      Acc acc;
      if (k0 + n * 16 <= last_key && (!kDocs || k0 + n * 16 + 15 >= warp_first)) {
        rows_dot_tile<S, HS>(acc, q_frag, k_base + static_cast<I64>(k0 + n * 16) * ld3, ld3);
      } else {
        wmma::fill_fragment(acc, 0.0f);
      }
      wmma::store_matrix_sync(scores + n * 16, acc, kScoreLd, wmma::mem_row_major);
    }
    __syncwarp();
    float x[kTile / 2];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < kTile / 2; ++i) {
      const int c = half * (kTile / 2) + i;
      const int key = k0 + c;
      const bool seen = key <= qrow && (!kDocs || key >= row_first);
      x[i] = seen ? scores[r * kScoreLd + c] * scale_log2 : -INFINITY;
      mx = fmaxf(mx, x[i]);
    }
    mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 1));
    const float m_new = fmaxf(m, mx);
    // A row that has seen no key of its document yet keeps m_new = -inf: exp2 then takes 0 as its
    // reference, so alpha and every p are exp2(-inf) = 0 (not -inf - -inf = NaN), and l, o stay 0.
    const float m_ref = kDocs && m_new == -INFINITY ? 0.0f : m_new;
    const float alpha = exp2f(m - m_ref);
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kTile / 2; ++i) {
      const float p = exp2f(x[i] - m_ref);
      sum += p;
      probs[r * kProbLd + half * (kTile / 2) + i] = st<S>(p);
    }
    sum += __shfl_xor_sync(kFullMask, sum, 1);
    l = l * alpha + sum;
    m = m_new;
#pragma unroll
    for (int i = 0; i < HS / 2; ++i) o[i] *= alpha;
    __syncwarp();
    // This tile's P V (16 x HS) through the score scratch, added to the lanes' rows.
#pragma unroll
    for (int dn = 0; dn < HS / 16; ++dn) {
      Acc acc;
      wmma::fill_fragment(acc, 0.0f);
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk) {
        if (k0 + kk * 16 > last_key || (kDocs && k0 + kk * 16 + 15 < warp_first)) continue;
        RowA<S> p_frag;
        RowB<S> v_frag;
        wmma::load_matrix_sync(p_frag, probs + kk * 16, kProbLd);
        wmma::load_matrix_sync(v_frag, v_base + static_cast<I64>(k0 + kk * 16) * ld3 + dn * 16,
                               ld3);
        wmma::mma_sync(acc, p_frag, v_frag, acc);
      }
      wmma::store_matrix_sync(scores + dn * 16, acc, kScoreLd, wmma::mem_row_major);
    }
    __syncwarp();
#pragma unroll
    for (int i = 0; i < HS / 2; ++i) o[i] += scores[r * kScoreLd + half * (HS / 2) + i];
    __syncwarp();
  }
  const float inv = 1.0f / l;
  S* orow = out + (static_cast<I64>(b) * T + qrow) * C + h * HS + half * (HS / 2);
#pragma unroll
  for (int i = 0; i < HS / 2; ++i) orow[i] = st<S>(o[i] * inv);
  if (half == 0) lse[static_cast<I64>(bh) * T + qrow] = (m + log2f(l)) * kLn2;
#else
  __trap();
#endif
}

// D[b,h,t] = sum_d dout[b,t,h*hs+d] * out[b,t,h*hs+d] in fp32: one warp per (b,t,h) row.
template <typename S>
__global__ void attention_row_dot_kernel(float* rowdot, const S* dout, const S* out, int B, int T,
                                         int C, int NH) {
  const I64 rows = static_cast<I64>(B) * T * NH;
  const I64 row = static_cast<I64>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int hs = C / NH;
  const int h = static_cast<int>(row % NH);
  const I64 bt = row / NH;
  const int t = static_cast<int>(bt % T);
  const int b = static_cast<int>(bt / T);
  const S* dy = dout + bt * C + h * hs;
  const S* y = out + bt * C + h * hs;
  float dot = 0.0f;
  for (int d = lane; d < hs; d += 32) dot += ld(dy[d]) * ld(y[d]);
  dot = warp_sum(dot);
  if (lane == 0) rowdot[(static_cast<I64>(b) * NH + h) * T + t] = dot;
}

// dQ: grid (T/64 query tiles, B*NH), the forward's geometry. Per key tile: the scores and
// dP = dout V^T (16 x 64 per warp), dS = P (dP - D) in 16-bit, dQ += dS K in fragments. With
// doc_start, the forward's key tiles and masks.
template <typename S, int HS, bool kDocs>
__global__ void __launch_bounds__(kThreads)
    flash_backward_dq_kernel(S* dqkv, const S* dout, const S* qkv, const float* lse,
                             const float* rowdot, int T, int C, int NH, float scale,
                             float scale_log2, const std::int32_t* doc_start, int window) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  __shared__ __align__(32) float s_scores[kWarps][16 * kScoreLd];
  __shared__ __align__(32) float s_dprobs[kWarps][16 * kScoreLd];
  __shared__ __align__(32) S s_ds[kWarps][16 * kProbLd];
  const int tile = static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x);
  const int bh = blockIdx.y;
  const int b = bh / NH, h = bh % NH;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r = lane / 2, half = lane % 2;
  const int q0 = tile * kTile + warp * 16;
  const int qrow = q0 + r;
  const int last_key = q0 + 15;
  const SequenceKeys docs = sequence_keys<kDocs>(doc_start, window, b, T);
  const int row_first = first_key<kDocs>(docs, qrow);
  const int warp_first = first_key<kDocs>(docs, q0);
  const int ld3 = 3 * C;
  const S* q_base = qkv + static_cast<I64>(b) * T * ld3 + h * HS;
  const S* k_base = q_base + C;
  const S* v_base = q_base + 2 * C;
  const S* dy_base = dout + static_cast<I64>(b) * T * C + h * HS;
  float* scores = s_scores[warp];
  float* dprobs = s_dprobs[warp];
  S* ds = s_ds[warp];
  const float row_lse2 = lse[static_cast<I64>(bh) * T + qrow] * kLog2e;
  const float row_d = rowdot[static_cast<I64>(bh) * T + qrow];

  RowA<S> q_frag[HS / 16], dy_frag[HS / 16];
#pragma unroll
  for (int kk = 0; kk < HS / 16; ++kk) {
    wmma::load_matrix_sync(q_frag[kk], q_base + static_cast<I64>(q0) * ld3 + kk * 16, ld3);
    wmma::load_matrix_sync(dy_frag[kk], dy_base + static_cast<I64>(q0) * C + kk * 16, C);
  }
  Acc dq[HS / 16];
#pragma unroll
  for (int dn = 0; dn < HS / 16; ++dn) wmma::fill_fragment(dq[dn], 0.0f);

  for (int k0 = warp_first / kTile * kTile; k0 <= last_key; k0 += kTile) {
#pragma unroll
    for (int n = 0; n < kTile / 16; ++n) {
      Acc s_acc, dp_acc;
      if (k0 + n * 16 <= last_key && (!kDocs || k0 + n * 16 + 15 >= warp_first)) {
        rows_dot_tile<S, HS>(s_acc, q_frag, k_base + static_cast<I64>(k0 + n * 16) * ld3, ld3);
        rows_dot_tile<S, HS>(dp_acc, dy_frag, v_base + static_cast<I64>(k0 + n * 16) * ld3, ld3);
      } else {
        wmma::fill_fragment(s_acc, 0.0f);
        wmma::fill_fragment(dp_acc, 0.0f);
      }
      wmma::store_matrix_sync(scores + n * 16, s_acc, kScoreLd, wmma::mem_row_major);
      wmma::store_matrix_sync(dprobs + n * 16, dp_acc, kScoreLd, wmma::mem_row_major);
    }
    __syncwarp();
#pragma unroll
    for (int i = 0; i < kTile / 2; ++i) {
      const int c = half * (kTile / 2) + i;
      const int key = k0 + c;
      const float p = key <= qrow && (!kDocs || key >= row_first)
                          ? exp2f(scores[r * kScoreLd + c] * scale_log2 - row_lse2)
                          : 0.0f;
      ds[r * kProbLd + c] = st<S>(p * (dprobs[r * kScoreLd + c] - row_d));
    }
    __syncwarp();
#pragma unroll
    for (int dn = 0; dn < HS / 16; ++dn) {
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk) {
        if (k0 + kk * 16 > last_key || (kDocs && k0 + kk * 16 + 15 < warp_first)) continue;
        RowA<S> ds_frag;
        RowB<S> k_frag;
        wmma::load_matrix_sync(ds_frag, ds + kk * 16, kProbLd);
        wmma::load_matrix_sync(k_frag, k_base + static_cast<I64>(k0 + kk * 16) * ld3 + dn * 16,
                               ld3);
        wmma::mma_sync(dq[dn], ds_frag, k_frag, dq[dn]);
      }
    }
    __syncwarp();
  }
#pragma unroll
  for (int dn = 0; dn < HS / 16; ++dn) {
    wmma::store_matrix_sync(scores + dn * 16, dq[dn], kScoreLd, wmma::mem_row_major);
  }
  __syncwarp();
  S* dq_row = dqkv + (static_cast<I64>(b) * T + qrow) * ld3 + h * HS;
#pragma unroll
  for (int i = 0; i < HS / 2; ++i) {
    const int d = half * (HS / 2) + i;
    dq_row[d] = st<S>(ld(dq_row[d]) + scale * scores[r * kScoreLd + d]);
  }
#else
  __trap();
#endif
}

// dK, dV: grid (T/64 key tiles, B*NH); warp w owns keys tile*64 + 16w .. +16 and visits every
// query tile from its own on (with doc_start, until the first query tile whose first query's
// document starts after the warp's last key: no later query sees its keys). Per query tile: P^T
// and dP^T = V dout^T (16 keys x 64 queries), then dV += P^T dout and dK += dS^T Q in fragments.
// The 16-bit P^T and dS^T overwrite the fp32 scratch they came from (each lane reads its values
// first, then the warp syncs).
template <typename S, int HS, bool kDocs>
__global__ void __launch_bounds__(kThreads)
    flash_backward_dkdv_kernel(S* dqkv, const S* dout, const S* qkv, const float* lse,
                               const float* rowdot, int T, int C, int NH, float scale,
                               float scale_log2, const std::int32_t* doc_start, int window) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  __shared__ __align__(32) float s_scores[kWarps][16 * kScoreLd];
  __shared__ __align__(32) float s_dprobs[kWarps][16 * kScoreLd];
  const int tile = blockIdx.x;  // the first key tiles see the most queries: launched first
  const int bh = blockIdx.y;
  const int b = bh / NH, h = bh % NH;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r = lane / 2, half = lane % 2;
  const int k0w = tile * kTile + warp * 16;
  const int krow = k0w + r;
  const int ld3 = 3 * C;
  const S* q_base = qkv + static_cast<I64>(b) * T * ld3 + h * HS;
  const S* k_base = q_base + C;
  const S* v_base = q_base + 2 * C;
  const S* dy_base = dout + static_cast<I64>(b) * T * C + h * HS;
  const float* lse_row = lse + static_cast<I64>(bh) * T;
  const float* d_row = rowdot + static_cast<I64>(bh) * T;
  const SequenceKeys docs = sequence_keys<kDocs>(doc_start, window, b, T);
  const int last_key = k0w + 15;
  float* scores = s_scores[warp];
  float* dprobs = s_dprobs[warp];
  S* probs16 = reinterpret_cast<S*>(scores);
  S* ds16 = reinterpret_cast<S*>(dprobs);

  RowA<S> k_frag[HS / 16], v_frag[HS / 16];
#pragma unroll
  for (int kk = 0; kk < HS / 16; ++kk) {
    wmma::load_matrix_sync(k_frag[kk], k_base + static_cast<I64>(k0w) * ld3 + kk * 16, ld3);
    wmma::load_matrix_sync(v_frag[kk], v_base + static_cast<I64>(k0w) * ld3 + kk * 16, ld3);
  }
  Acc dk[HS / 16], dv[HS / 16];
#pragma unroll
  for (int dn = 0; dn < HS / 16; ++dn) {
    wmma::fill_fragment(dk[dn], 0.0f);
    wmma::fill_fragment(dv[dn], 0.0f);
  }

  for (int qb = tile * kTile; qb < T && (!kDocs || first_key<kDocs>(docs, qb) <= last_key);
       qb += kTile) {
#pragma unroll
    for (int n = 0; n < kTile / 16; ++n) {
      Acc s_acc, dp_acc;
      // Else every query is before every key, or every query's document starts after the last
      // key: all masked.
      if (qb + n * 16 + 15 >= k0w && (!kDocs || first_key<kDocs>(docs, qb + n * 16) <= last_key)) {
        rows_dot_tile<S, HS>(s_acc, k_frag, q_base + static_cast<I64>(qb + n * 16) * ld3, ld3);
        rows_dot_tile<S, HS>(dp_acc, v_frag, dy_base + static_cast<I64>(qb + n * 16) * C, C);
      } else {
        wmma::fill_fragment(s_acc, 0.0f);
        wmma::fill_fragment(dp_acc, 0.0f);
      }
      wmma::store_matrix_sync(scores + n * 16, s_acc, kScoreLd, wmma::mem_row_major);
      wmma::store_matrix_sync(dprobs + n * 16, dp_acc, kScoreLd, wmma::mem_row_major);
    }
    __syncwarp();
    float p[kTile / 2], g[kTile / 2];
#pragma unroll
    for (int i = 0; i < kTile / 2; ++i) {
      const int c = half * (kTile / 2) + i;
      const int query = qb + c;
      p[i] = krow <= query && (!kDocs || krow >= first_key<kDocs>(docs, query))
                 ? exp2f(scores[r * kScoreLd + c] * scale_log2 - lse_row[query] * kLog2e)
                 : 0.0f;
      g[i] = p[i] * (dprobs[r * kScoreLd + c] - d_row[query]);
    }
    __syncwarp();
#pragma unroll
    for (int i = 0; i < kTile / 2; ++i) {
      const int c = half * (kTile / 2) + i;
      probs16[r * kProbLd + c] = st<S>(p[i]);
      ds16[r * kProbLd + c] = st<S>(g[i]);
    }
    __syncwarp();
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk) {
      if (qb + kk * 16 + 15 < k0w || (kDocs && first_key<kDocs>(docs, qb + kk * 16) > last_key)) {
        continue;
      }
      RowA<S> p_frag, ds_frag;
      wmma::load_matrix_sync(p_frag, probs16 + kk * 16, kProbLd);
      wmma::load_matrix_sync(ds_frag, ds16 + kk * 16, kProbLd);
#pragma unroll
      for (int dn = 0; dn < HS / 16; ++dn) {
        RowB<S> dy_frag, q_frag;
        wmma::load_matrix_sync(dy_frag, dy_base + static_cast<I64>(qb + kk * 16) * C + dn * 16, C);
        wmma::mma_sync(dv[dn], p_frag, dy_frag, dv[dn]);
        wmma::load_matrix_sync(q_frag, q_base + static_cast<I64>(qb + kk * 16) * ld3 + dn * 16,
                               ld3);
        wmma::mma_sync(dk[dn], ds_frag, q_frag, dk[dn]);
      }
    }
    __syncwarp();
  }
  S* dk_row = dqkv + (static_cast<I64>(b) * T + krow) * ld3 + C + h * HS;
  S* dv_row = dk_row + C;
#pragma unroll
  for (int dn = 0; dn < HS / 16; ++dn) {
    wmma::store_matrix_sync(scores + dn * 16, dk[dn], kScoreLd, wmma::mem_row_major);
    wmma::store_matrix_sync(dprobs + dn * 16, dv[dn], kScoreLd, wmma::mem_row_major);
  }
  __syncwarp();
#pragma unroll
  for (int i = 0; i < HS / 2; ++i) {
    const int d = half * (HS / 2) + i;
    dk_row[d] = st<S>(ld(dk_row[d]) + scale * scores[r * kScoreLd + d]);
    dv_row[d] = st<S>(ld(dv_row[d]) + dprobs[r * kScoreLd + d]);
  }
#else
  __trap();
#endif
}

void check_aligned(const void* p, const char* what) {
  ZRT_CHECK(reinterpret_cast<std::uintptr_t>(p) % 32 == 0,
            "fused attention: {} at {} is not 32-byte aligned (WMMA loads need it)", what, p);
}

// The mma kernels stage rows with 16-byte loads.
void check_aligned16(const void* p, const char* what) {
  ZRT_CHECK(
      reinterpret_cast<std::uintptr_t>(p) % 16 == 0,
      "grouped-query attention: {} at {} is not 16-byte aligned (the fused kernels' tile loads "
      "need it)",
      what, p);
}

// rowdot (B,NH,T) fp32 = dout . out per row and head: the backward's D, one warp per row.
void row_dot(const Launch& l, DType dtype, float* rowdot, const void* dout, const void* out, int B,
             int T, int C, int NH) {
  with_16bit_storage(dtype, "fused attention", [&](auto s) {
    using S = typename decltype(s)::type;
    constexpr int kRowThreads = 256;
    const I64 rows = static_cast<I64>(B) * T * NH;
    attention_row_dot_kernel<S>
        <<<static_cast<unsigned>((rows + kRowThreads / 32 - 1) / (kRowThreads / 32)), kRowThreads,
           0, l.stream>>>(rowdot, static_cast<const S*>(dout), static_cast<const S*>(out), B, T, C,
                          NH);
    ZRT_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace

void flash_attention_forward(const Launch& l, DType dtype, void* out, float* lse, const void* qkv,
                             int B, int T, int C, int NH, FlashKernels kernels,
                             const std::int32_t* doc_start, int window) {
  ZRT_CHECK(flash_attention_supported(dtype, T, C, NH, kernels),
            "fused attention: unsupported shape T={} C={} NH={} ({})", T, C, NH, dtype_name(dtype));
  check_aligned(qkv, "qkv");
  if (kernels != FlashKernels::kWmma) {
    flash_mma_forward(l, dtype, out, lse, packed_head_rows(qkv, dtype, C), B, T, C, NH, doc_start,
                      window, kernels == FlashKernels::kMmaPipelined);
    return;
  }
  const float scale_log2 = kLog2e / sqrtf(static_cast<float>(kHeadSize));
  const dim3 grid(static_cast<unsigned>(T / kTile), static_cast<unsigned>(B * NH));
  with_16bit_storage(dtype, "fused attention", [&](auto s) {
    using S = typename decltype(s)::type;
    if (doc_start != nullptr || window > 0) {
      flash_forward_kernel<S, kHeadSize, true>
          <<<grid, kThreads, 0, l.stream>>>(static_cast<S*>(out), lse, static_cast<const S*>(qkv),
                                            T, C, NH, scale_log2, doc_start, window);
    } else {
      flash_forward_kernel<S, kHeadSize, false><<<grid, kThreads, 0, l.stream>>>(
          static_cast<S*>(out), lse, static_cast<const S*>(qkv), T, C, NH, scale_log2, nullptr, 0);
    }
    ZRT_CUDA_LAUNCH_CHECK();
  });
}

void flash_attention_backward(const Launch& l, DType dtype, void* dqkv, const void* dout,
                              const void* qkv, const void* out, const float* lse, int B, int T,
                              int C, int NH, FlashKernels kernels, const std::int32_t* doc_start,
                              int window) {
  ZRT_CHECK(flash_attention_supported(dtype, T, C, NH, kernels),
            "fused attention: unsupported shape T={} C={} NH={} ({})", T, C, NH, dtype_name(dtype));
  check_aligned(qkv, "qkv");
  check_aligned(dout, "dout");
  const float scale = 1.0f / sqrtf(static_cast<float>(kHeadSize));
  const float scale_log2 = scale * kLog2e;
  float* rowdot = static_cast<float*>(l.ws);
  row_dot(l, dtype, rowdot, dout, out, B, T, C, NH);
  if (kernels != FlashKernels::kWmma) {
    flash_mma_backward(l, dtype, packed_head_gradients(dqkv, dtype, C), dout,
                       packed_head_rows(qkv, dtype, C), lse, rowdot, B, T, C, NH, doc_start, window,
                       kernels == FlashKernels::kMmaPipelined);
    return;
  }
  const dim3 grid(static_cast<unsigned>(T / kTile), static_cast<unsigned>(B * NH));
  with_16bit_storage(dtype, "fused attention", [&](auto s) {
    using S = typename decltype(s)::type;
    auto run = [&](auto docs) {
      constexpr bool kDocs = decltype(docs)::value;
      flash_backward_dkdv_kernel<S, kHeadSize, kDocs><<<grid, kThreads, 0, l.stream>>>(
          static_cast<S*>(dqkv), static_cast<const S*>(dout), static_cast<const S*>(qkv), lse,
          rowdot, T, C, NH, scale, scale_log2, doc_start, window);
      ZRT_CUDA_LAUNCH_CHECK();
      flash_backward_dq_kernel<S, kHeadSize, kDocs><<<grid, kThreads, 0, l.stream>>>(
          static_cast<S*>(dqkv), static_cast<const S*>(dout), static_cast<const S*>(qkv), lse,
          rowdot, T, C, NH, scale, scale_log2, doc_start, window);
      ZRT_CUDA_LAUNCH_CHECK();
    };
    if (doc_start != nullptr || window > 0) {
      run(std::true_type{});
    } else {
      run(std::false_type{});
    }
  });
}

namespace {
HeadRows grouped_head_rows(const void* q, const void* k, const void* v, int NH, int NKV, int hs) {
  check_aligned16(q, "q");
  check_aligned16(k, "k");
  check_aligned16(v, "v");
  return {q, k, v, NH * hs, NKV * hs, NH / NKV};
}
}  // namespace

void flash_gqa_forward(const Launch& l, DType dtype, void* out, float* lse, const void* q,
                       const void* k, const void* v, int B, int T, int NH, int NKV, int hs,
                       const std::int32_t* doc_start, int window, FlashKernels kernels) {
  ZRT_CHECK(flash_gqa_supported(dtype, T, NH, NKV, hs),
            "grouped-query attention (fused): unsupported shape T={} NH={} NKV={} hs={} ({})", T,
            NH, NKV, hs, dtype_name(dtype));
  ZRT_CHECK(kernels != FlashKernels::kWmma,
            "grouped-query attention (fused): the WMMA kernels read packed rows only");
  flash_mma_forward(l, dtype, out, lse, grouped_head_rows(q, k, v, NH, NKV, hs), B, T, NH * hs, NH,
                    doc_start, window, kernels == FlashKernels::kMmaPipelined);
}

void flash_gqa_backward(const Launch& l, DType dtype, void* dq, void* dk, void* dv,
                        const void* dout, const void* q, const void* k, const void* v,
                        const void* out, const float* lse, int B, int T, int NH, int NKV, int hs,
                        const std::int32_t* doc_start, int window, FlashKernels kernels) {
  ZRT_CHECK(flash_gqa_supported(dtype, T, NH, NKV, hs),
            "grouped-query attention (fused): unsupported shape T={} NH={} NKV={} hs={} ({})", T,
            NH, NKV, hs, dtype_name(dtype));
  check_aligned16(dout, "dout");
  check_aligned16(dq, "dq");
  check_aligned16(dk, "dk");
  check_aligned16(dv, "dv");
  const int C = NH * hs;
  float* rowdot = static_cast<float*>(l.ws);
  row_dot(l, dtype, rowdot, dout, out, B, T, C, NH);
  ZRT_CHECK(kernels != FlashKernels::kWmma,
            "grouped-query attention (fused): the WMMA kernels read packed rows only");
  flash_mma_backward(l, dtype, HeadGradients{dq, dk, dv}, dout,
                     grouped_head_rows(q, k, v, NH, NKV, hs), lse, rowdot, B, T, C, NH, doc_start,
                     window, kernels == FlashKernels::kMmaPipelined);
}

}  // namespace zrt::kernels::cuda
