#include "kernels/cuda/flash_attention_mma.cuh"

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/mma_fragments.h"
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

// One block: 4 warps over 64 rows (queries; keys for dK/dV), 16 rows per warp. Head size HS is
// 64 or 128 (a template parameter); a block writes COLS of its rows' HS output columns (grid.z =
// HS / COLS blocks per tile), which bounds the accumulators a thread keeps at COLS / 2 floats.
constexpr int kTile = 64;
static_assert(kTile == kFlashTile, "attention_plan.h plans the shapes these kernels take");
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
// Staged row stride (elements) of a tile of HS columns (mma_fragments.h): no bank is hit twice
// by the fragment reads below.
template <int HS>
constexpr int kLd = staged_row_stride(HS);
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr unsigned kFull = 0xffffffffu;

// Fragment layouts of mma.m16n8k16 (PTX ISA), lane = 4 g + t:
//   A (16x16, row): reg 0 (row g, cols 2t, 2t+1), 1 (row g+8, same), 2 (row g, cols 2t+8, +9),
//                   3 (row g+8, cols 2t+8, +9); a register holds two 16-bit values, the lower
//                   column in its low half.
//   B (16x8, col):  reg 0 (rows k = 2t, 2t+1 of column n = g), reg 1 (rows 2t+8, 2t+9).
//   C (16x8, f32):  c0, c1 (row g, cols 2t, 2t+1), c2, c3 (row g+8, cols 2t, 2t+1).
template <typename S>
__device__ __forceinline__ void mma(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                    std::uint32_t b1) {
  if constexpr (std::is_same_v<S, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

template <typename S>
__device__ __forceinline__ std::uint16_t bits(S v) {
  return *reinterpret_cast<const std::uint16_t*>(&v);
}
// Two values rounded to S, `lo` in the low half.
template <typename S>
__device__ __forceinline__ std::uint32_t pack2(float lo, float hi) {
  return static_cast<std::uint32_t>(bits(st<S>(lo))) |
         (static_cast<std::uint32_t>(bits(st<S>(hi))) << 16);
}
// Two 16-bit values from two addresses (a B operand whose k runs down a staged tile's rows).
template <typename S>
__device__ __forceinline__ std::uint32_t pair(const S* lo, const S* hi) {
  return static_cast<std::uint32_t>(bits(*lo)) | (static_cast<std::uint32_t>(bits(*hi)) << 16);
}
__device__ __forceinline__ std::uint32_t word(const void* p) {
  return *reinterpret_cast<const std::uint32_t*>(p);
}

// The pipelined kernels' shared-memory reads and copies (sm_80 and newer; PTX ISA).
__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
// Four 8x8 matrices of 16-bit values, each lane giving one row's shared-memory address
// (mma_fragments.h). Callers convert a lane's base address once and add constant offsets, which
// the instruction takes as immediates.
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], unsigned row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(row));
}
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], unsigned row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(row));
}
// Asynchronous copies from global to shared memory that bypass the registers: issued, gathered
// into a group by copy_async_commit, and waited for (all of this thread's) by copy_async_wait.
// 16 bytes through L2 only (a tile is read once per block), or 4 bytes (row statistics, whose
// addresses need not be 16-byte aligned).
__device__ __forceinline__ void copy_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(shared_address(dst)), "l"(src)
               : "memory");
}
__device__ __forceinline__ void copy_async4(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(shared_address(dst)), "l"(src)
               : "memory");
}
__device__ __forceinline__ void copy_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
__device__ __forceinline__ void copy_async_wait() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}

// The A fragments of 16 rows x HS (head dims) of a row-major matrix at `rows` (row stride ld).
template <int HS, typename S>
__device__ __forceinline__ void load_rows(std::uint32_t (&a)[HS / 16][4], const S* rows, int ld,
                                          int g, int t) {
#pragma unroll
  for (int kk = 0; kk < HS / 16; ++kk) {
    const S* p = rows + kk * 16 + 2 * t;
    a[kk][0] = word(p + static_cast<I64>(g) * ld);
    a[kk][1] = word(p + static_cast<I64>(g + 8) * ld);
    a[kk][2] = word(p + static_cast<I64>(g) * ld + 8);
    a[kk][3] = word(p + static_cast<I64>(g + 8) * ld + 8);
  }
}

// A 64 x HS tile (row stride ld in global memory) into shared memory (row stride kLd<HS>), 16
// bytes per thread per step: through registers, or (kAsync) as asynchronous copies the caller
// commits and waits for.
template <int HS, bool kAsync, typename S>
__device__ __forceinline__ void stage(S* dst, const S* src, int ld) {
  if constexpr (kAsync) {
    // mma_fragments.h's tile_copy_place: a fixed trip count, the offsets constants.
    static_assert(kThreads % (HS / 8) == 0 && kTile % (kThreads / (HS / 8)) == 0,
                  "every piece of the tile copied once");
    const StagedPlace first = tile_copy_place(static_cast<int>(threadIdx.x), 0, HS, kThreads);
    const StagedPlace second = tile_copy_place(static_cast<int>(threadIdx.x), 1, HS, kThreads);
    const int row_step = second.row - first.row;
    S* to = dst + first.row * kLd<HS> + first.col;
    const S* from = src + static_cast<I64>(first.row) * ld + first.col;
#pragma unroll
    for (int n = 0; n < tile_copy_steps(kTile, HS, kThreads); ++n) {
      copy_async16(to + n * row_step * kLd<HS>, from + static_cast<I64>(n) * row_step * ld);
    }
  } else {
    for (int i = threadIdx.x; i < kTile * (HS / 8); i += kThreads) {
      const int row = i / (HS / 8), part = i % (HS / 8);
      *reinterpret_cast<uint4*>(dst + row * kLd<HS> + part * 8) =
          *reinterpret_cast<const uint4*>(src + static_cast<I64>(row) * ld + part * 8);
    }
  }
}

// The tile loop's shared memory. Staged (kPipelined false): one buffer; before tile i every warp
// finishes tile i - 1, the block copies tile i through registers (copy_this(0)) and waits for it.
// Pipelined: two buffers; tile i, whose copy was issued one iteration earlier (the loop's first
// by the caller, into buffer 0), is waited for, and once every warp is done with tile i - 1 (the
// barrier) the copy of tile i + 1 (copy_next, if has_next) goes into that tile's buffer, to land
// while tile i is computed. Returns the buffer tile i is in. Every thread of the block calls it
// with the same i and has_next.
template <bool kPipelined, typename CopyThis, typename CopyNext>
__device__ __forceinline__ int arrive_tile(int i, bool has_next, CopyThis&& copy_this,
                                           CopyNext&& copy_next) {
  if constexpr (kPipelined) {
    copy_async_wait();
    __syncthreads();
    if (has_next) copy_next((i + 1) & 1);
    copy_async_commit();
    return i & 1;
  } else {
    __syncthreads();  // the previous tile's reads are done
    copy_this(0);
    __syncthreads();
    return 0;
  }
}

// acc[j] (16 rows x 8 columns, j < 8) = rows . tile^T for the 64 staged rows of `tile` (HS
// columns each), tiles of 8 columns whose first column index is past `last` skipped (left zero).
// (Skipping the columns before a document's start as well costs the forward at head size 128
// about 65 more registers a thread, for a saving in the one key tile a document starts in: the
// masks below zero those columns instead.)
// The forward's and dQ's staged key and value tiles (kKeys, kValues elements each): static
// shared memory, one of each, staged; pipelined, two of each in the launch's dynamic shared
// memory, buffer b of each at + b times its size.
template <typename S, int kKeys, int kValues, bool kPipelined>
__device__ __forceinline__ void key_value_buffers(S*& k_s, S*& v_s) {
  if constexpr (kPipelined) {
    extern __shared__ __align__(16) unsigned char flash_mma_shared[];
    k_s = reinterpret_cast<S*>(flash_mma_shared);
    v_s = k_s + 2 * kKeys;
  } else {
    __shared__ __align__(16) S k_staged[kKeys];
    __shared__ __align__(16) S v_staged[kValues];
    k_s = k_staged;
    v_s = v_staged;
  }
}

// The forward's and dQ's key tiles through arrive_tile: copy(k0, buffer) copies the tile at key
// k0. start_key_tiles before the loop (the pipelined kernels' first copy), arrive_key_tile at the
// top of each trip i over k0 = first, first + 64, ..., last; it returns tile k0's buffer.
template <bool kPipelined, typename Copy>
__device__ __forceinline__ void start_key_tiles(const Copy& copy, int first) {
  if constexpr (kPipelined) {
    copy(first, 0);
    copy_async_commit();
  }
}
template <bool kPipelined, typename Copy>
__device__ __forceinline__ int arrive_key_tile(const Copy& copy, int i, int k0, int last) {
  return arrive_tile<kPipelined>(
      i, k0 + kTile <= last, [&](int b) { copy(k0, b); }, [&](int b) { copy(k0 + kTile, b); });
}

// kLdmatrix: the B operands read with ldmatrix, two k-steps an instruction (the same values in
// the same order, so the same results bit for bit).
template <int HS, bool kLdmatrix, typename S>
__device__ __forceinline__ void rows_dot_staged(float (&acc)[8][4],
                                                const std::uint32_t (&a)[HS / 16][4], const S* tile,
                                                int first, int last, int g, int t) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[j][c] = 0.0f;
    if (first + 8 * j > last) continue;
    if constexpr (kLdmatrix) {
      const StagedPlace at = rows_dot_tile_place(4 * g + t);
      const unsigned base = shared_address(tile + at.row * kLd<HS> + at.col);
#pragma unroll
      for (int kk = 0; kk < HS / 16; kk += 2) {
        std::uint32_t b[4];
        ldmatrix_x4(b, base + (8 * j * kLd<HS> + kk * 16) * sizeof(S));
        mma<S>(acc[j], a[kk], b[0], b[1]);
        mma<S>(acc[j], a[kk + 1], b[2], b[3]);
      }
    } else {
#pragma unroll
      for (int kk = 0; kk < HS / 16; ++kk) {
        const S* p = tile + (8 * j + g) * kLd<HS> + kk * 16 + 2 * t;
        mma<S>(acc[j], a[kk], word(p), word(p + 8));
      }
    }
  }
}

// acc[dn] (16 rows x 8 head dims, dn < COLS/8) += A (16 rows x 64 staged rows, as 4 fragments)
// . tile, where tile points at the first of COLS head dims of the 64 staged rows (row stride
// kLd<HS>); k-chunks of 16 staged rows that `skip` marks are left out.
// kLdmatrix: the B operands read with ldmatrix .trans, two column groups an instruction (the same
// values in the same order).
template <int HS, int COLS, bool kLdmatrix, typename S>
__device__ __forceinline__ void rows_times_staged(float (&acc)[COLS / 8][4],
                                                  const std::uint32_t (&a)[4][4], const S* tile,
                                                  const bool (&skip)[4], int g, int t) {
  constexpr int ld = kLd<HS>;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    if (skip[kk]) continue;
    if constexpr (kLdmatrix) {
      const StagedPlace at = rows_times_tile_place(4 * g + t);
      const unsigned base = shared_address(tile + at.row * ld + at.col);
#pragma unroll
      for (int dn = 0; dn < COLS / 8; dn += 2) {
        std::uint32_t b[4];
        ldmatrix_x4_trans(b, base + (kk * 16 * ld + dn * 8) * sizeof(S));
        mma<S>(acc[dn], a[kk], b[0], b[1]);
        mma<S>(acc[dn + 1], a[kk], b[2], b[3]);
      }
    } else {
      const S* p = tile + (kk * 16 + 2 * t) * ld + g;
#pragma unroll
      for (int dn = 0; dn < COLS / 8; ++dn) {
        const S* q = p + dn * 8;
        mma<S>(acc[dn], a[kk], pair(q, q + ld), pair(q + 8 * ld, q + 9 * ld));
      }
    }
  }
}

// The A fragments of a 16 x 64 accumulator set (8 tiles of 8 columns), rounded to S.
template <typename S>
__device__ __forceinline__ void to_a(std::uint32_t (&a)[4][4], const float (&acc)[8][4]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    a[kk][0] = pack2<S>(acc[2 * kk][0], acc[2 * kk][1]);
    a[kk][1] = pack2<S>(acc[2 * kk][2], acc[2 * kk][3]);
    a[kk][2] = pack2<S>(acc[2 * kk + 1][0], acc[2 * kk + 1][1]);
    a[kk][3] = pack2<S>(acc[2 * kk + 1][2], acc[2 * kk + 1][3]);
  }
}

// 2^x on the special-function unit (ex2.approx.ftz.f32): what exp2f compiles to for x >= -126,
// without the rescaling exp2f adds below that to return a denormal (here 0), which saves 3
// instructions a probability. Such a probability (under 2^-126) enters sums that hold a term of
// about 1 (the row's largest probability, or in the backward products of the same size as the
// rest), so in practice nothing changes; exp2(-inf) = 0 as before.
__device__ __forceinline__ float exp2_fast(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(kFull, v, 1));
  return fmaxf(v, __shfl_xor_sync(kFull, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(kFull, v, 1);
  return v + __shfl_xor_sync(kFull, v, 2);
}

// rows g and g+8 of a 16 x COLS accumulator set (acc[dn][c], columns 8 dn + 2t + c%2): added,
// scaled, into the rows at dst0 and dst1, in storage type S.
template <int COLS, typename S>
__device__ __forceinline__ void add_rows(S* dst0, S* dst1, const float (&acc)[COLS / 8][4],
                                         float scale, int t) {
#pragma unroll
  for (int dn = 0; dn < COLS / 8; ++dn) {
    const int d = dn * 8 + 2 * t;
    dst0[d] = st<S>(ld(dst0[d]) + scale * acc[dn][0]);
    dst0[d + 1] = st<S>(ld(dst0[d + 1]) + scale * acc[dn][1]);
    dst1[d] = st<S>(ld(dst1[d]) + scale * acc[dn][2]);
    dst1[d + 1] = st<S>(ld(dst1[d + 1]) + scale * acc[dn][3]);
  }
}

// Calls f(std::bool_constant<kMasked>): false where a tile needs no per-element mask (the
// pipelined kernels' tiles wholly below the diagonal, without documents), true elsewhere. The
// staged kernels mask every tile (the mask keeps every element of such a tile, so both give the
// same values) and build only the masked version.
template <bool kPipelined, typename F>
__device__ __forceinline__ void with_mask(bool whole, F&& f) {
  if (kPipelined && whole) {
    f(std::false_type{});
  } else {
    f(std::true_type{});
  }
}

// Packed documents: each kernel is built for kDocs false and true (first_key, device_math.cuh);
// with kDocs false it has the same registers and gives the same results bit for bit.

// The first of the COLS output columns (head dims) a block writes: blockIdx.z's share.
template <int HS, int COLS>
__device__ __forceinline__ int first_column() {
  static_assert(HS % COLS == 0 && COLS % 16 == 0, "COLS: a multiple of 16 dividing HS");
  if constexpr (COLS == HS) {
    return 0;
  } else {
    return static_cast<int>(blockIdx.z) * COLS;
  }
}

// Forward: grid (T/64 query tiles, longest first; B*NH; HS/COLS). Each block stages the key
// tiles (all HS columns) and the value tiles (its COLS columns) of its query head's key/value
// head up to its diagonal; each warp keeps 16 rows' running max, partial sums and COLS outputs.
// Blocks of one tile that split the columns compute the same statistics; the first writes lse.
// With doc_start the key tiles start at the one holding the document start of the block's first
// query, a warp skips the tiles before its first row's, and keys before a row's document start
// are masked.
template <typename S, int HS, int COLS, bool kDocs, bool kPipelined>
__global__ void __launch_bounds__(kThreads)
    flash_mma_forward_kernel(S* out, float* lse, const S* q, const S* k, const S* v, int q_ld,
                             int kv_ld, int group, int T, int C, int NH, float scale_log2,
                             const std::int32_t* doc_start, int window) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  constexpr int kKeys = kTile * kLd<HS>, kValues = kTile * kLd<COLS>;
  S* k_s;
  S* v_s;
  key_value_buffers<S, kKeys, kValues, kPipelined>(k_s, v_s);
  const int tile = static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x);
  const int bh = blockIdx.y;
  const int b = bh / NH, h = bh % NH;
  const int col0 = first_column<HS, COLS>();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int q0 = tile * kTile + warp * 16;
  const int row0 = q0 + g, row1 = q0 + g + 8;
  const int last_key = q0 + 15;
  const SequenceKeys docs = sequence_keys<kDocs>(doc_start, window, b, T);
  const int first0 = first_key<kDocs>(docs, row0), first1 = first_key<kDocs>(docs, row1);
  const int warp_first = first_key<kDocs>(docs, q0);
  const S* q_base = q + static_cast<I64>(b) * T * q_ld + h * HS;
  const S* k_base = k + static_cast<I64>(b) * T * kv_ld + (h / group) * HS;
  const S* v_base = v + static_cast<I64>(b) * T * kv_ld + (h / group) * HS + col0;

  std::uint32_t qa[HS / 16][4];
  load_rows<HS>(qa, q_base + static_cast<I64>(q0) * q_ld, q_ld, g, t);
  float o[COLS / 8][4] = {};
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;

  // Every warp of the block visits the same key tiles (k0 <= tile * 64 <= q0). Without documents
  // each row sees key k0 in each and its max is finite from the first tile on; with them a row
  // may see no key of a tile (its document starts later), which ref0, ref1 below handle.
  const int k_first = first_key<kDocs>(docs, tile * kTile) / kTile * kTile;
  auto copy_tile = [&](int k0, int buffer) {
    stage<HS, kPipelined>(k_s + buffer * kKeys, k_base + static_cast<I64>(k0) * kv_ld, kv_ld);
    stage<COLS, kPipelined>(v_s + buffer * kValues, v_base + static_cast<I64>(k0) * kv_ld, kv_ld);
  };
  start_key_tiles<kPipelined>(copy_tile, k_first);
  for (int k0 = k_first, i = 0; k0 <= tile * kTile; k0 += kTile, ++i) {
    const int buffer = arrive_key_tile<kPipelined>(copy_tile, i, k0, tile * kTile);
    // All 64 keys before every row's document: masked, the tile would leave m, l and o as they are.
    if (kDocs && k0 + kTile <= warp_first) continue;
    const S* keys = k_s + buffer * kKeys;
    const S* values = v_s + buffer * kValues;
    float s[8][4];
    rows_dot_staged<HS, kPipelined, S>(s, qa, keys, k0, last_key, g, t);
    float mx0 = -INFINITY, mx1 = -INFINITY;
    // The warp's rows all after the tile's last key (and no documents): every key seen.
    with_mask<kPipelined>(!kDocs && k0 + kTile - 1 <= q0, [&](auto masked) {
      constexpr bool kMasked = decltype(masked)::value;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int key = k0 + 8 * j + 2 * t + (c & 1);
          const bool top = c < 2;
          const bool seen = !kMasked || (key <= (top ? row0 : row1) &&
                                         (!kDocs || key >= (top ? first0 : first1)));
          s[j][c] = seen ? s[j][c] * scale_log2 : -INFINITY;
          if (c < 2) {
            mx0 = fmaxf(mx0, s[j][c]);
          } else {
            mx1 = fmaxf(mx1, s[j][c]);
          }
        }
      }
    });
    const float n0 = fmaxf(m0, quad_max(mx0)), n1 = fmaxf(m1, quad_max(mx1));
    // A row that has seen no key of its document yet keeps its max at -inf: exp2 then takes 0 as
    // the reference, so the rescale and every p are exp2(-inf) = 0 (not -inf - -inf = NaN) and
    // the row's l and o stay 0. Otherwise the reference is the max itself.
    const float ref0 = kDocs && n0 == -INFINITY ? 0.0f : n0;
    const float ref1 = kDocs && n1 == -INFINITY ? 0.0f : n1;
    const float a0 = exp2_fast(m0 - ref0), a1 = exp2_fast(m1 - ref1);
    m0 = n0;
    m1 = n1;
    float ps0 = 0.0f, ps1 = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        s[j][c] = exp2_fast(s[j][c] - (c < 2 ? ref0 : ref1));
        if (c < 2) {
          ps0 += s[j][c];
        } else {
          ps1 += s[j][c];
        }
      }
    }
    l0 = l0 * a0 + ps0;  // this thread's part of the row sums; the quad adds them at the end
    l1 = l1 * a1 + ps1;
#pragma unroll
    for (int dn = 0; dn < COLS / 8; ++dn) {
      o[dn][0] *= a0;
      o[dn][1] *= a0;
      o[dn][2] *= a1;
      o[dn][3] *= a1;
    }
    std::uint32_t pa[4][4];
    to_a<S>(pa, s);
    const bool skip[4] = {k0 > last_key || (kDocs && k0 + 15 < warp_first),
                          k0 + 16 > last_key || (kDocs && k0 + 31 < warp_first),
                          k0 + 32 > last_key || (kDocs && k0 + 47 < warp_first),
                          k0 + 48 > last_key || (kDocs && k0 + 63 < warp_first)};
    rows_times_staged<COLS, COLS, kPipelined, S>(o, pa, values, skip, g, t);
  }
  l0 = quad_sum(l0);
  l1 = quad_sum(l1);
  S* out0 = out + (static_cast<I64>(b) * T + row0) * C + h * HS + col0;
  S* out1 = out + (static_cast<I64>(b) * T + row1) * C + h * HS + col0;
#pragma unroll
  for (int dn = 0; dn < COLS / 8; ++dn) {
    const int d = dn * 8 + 2 * t;
    *reinterpret_cast<std::uint32_t*>(out0 + d) = pack2<S>(o[dn][0] / l0, o[dn][1] / l0);
    *reinterpret_cast<std::uint32_t*>(out1 + d) = pack2<S>(o[dn][2] / l1, o[dn][3] / l1);
  }
  if (t == 0 && col0 == 0) {
    lse[static_cast<I64>(bh) * T + row0] = (m0 + log2f(l0)) * kLn2;
    lse[static_cast<I64>(bh) * T + row1] = (m1 + log2f(l1)) * kLn2;
  }
#else
  __trap();
#endif
}

// dQ: the forward's geometry (with doc_start, its key tiles and masks). Per key tile: S = Q K^T
// and dP = dout V^T in registers, dS = P (dP - D), dQ += dS K (the block's COLS columns of K).
template <typename S, int HS, int COLS, bool kDocs, bool kPipelined>
__global__ void __launch_bounds__(kThreads)
    flash_mma_dq_kernel(S* dq_out, const S* dout, const S* q, const S* k, const S* v, int q_ld,
                        int kv_ld, int group, const float* lse, const float* rowdot, int T, int C,
                        int NH, float scale, float scale_log2, const std::int32_t* doc_start,
                        int window) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  constexpr int kRows = kTile * kLd<HS>;
  S* k_s;
  S* v_s;
  key_value_buffers<S, kRows, kRows, kPipelined>(k_s, v_s);
  const int tile = static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x);
  const int bh = blockIdx.y;
  const int b = bh / NH, h = bh % NH;
  const int col0 = first_column<HS, COLS>();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int q0 = tile * kTile + warp * 16;
  const int row0 = q0 + g, row1 = q0 + g + 8;
  const int last_key = q0 + 15;
  const SequenceKeys docs = sequence_keys<kDocs>(doc_start, window, b, T);
  const int first0 = first_key<kDocs>(docs, row0), first1 = first_key<kDocs>(docs, row1);
  const int warp_first = first_key<kDocs>(docs, q0);
  const S* q_base = q + static_cast<I64>(b) * T * q_ld + h * HS;
  const S* k_base = k + static_cast<I64>(b) * T * kv_ld + (h / group) * HS;
  const S* v_base = v + static_cast<I64>(b) * T * kv_ld + (h / group) * HS;
  const S* dy_base = dout + static_cast<I64>(b) * T * C + h * HS;
  const float lse0 = lse[static_cast<I64>(bh) * T + row0] * kLog2e;
  const float lse1 = lse[static_cast<I64>(bh) * T + row1] * kLog2e;
  const float d0 = rowdot[static_cast<I64>(bh) * T + row0];
  const float d1 = rowdot[static_cast<I64>(bh) * T + row1];

  std::uint32_t qa[HS / 16][4], da[HS / 16][4];
  load_rows<HS>(qa, q_base + static_cast<I64>(q0) * q_ld, q_ld, g, t);
  load_rows<HS>(da, dy_base + static_cast<I64>(q0) * C, C, g, t);
  float dq[COLS / 8][4] = {};

  const int k_first = first_key<kDocs>(docs, tile * kTile) / kTile * kTile;
  auto copy_tile = [&](int k0, int buffer) {
    stage<HS, kPipelined>(k_s + buffer * kRows, k_base + static_cast<I64>(k0) * kv_ld, kv_ld);
    stage<HS, kPipelined>(v_s + buffer * kRows, v_base + static_cast<I64>(k0) * kv_ld, kv_ld);
  };
  start_key_tiles<kPipelined>(copy_tile, k_first);
  for (int k0 = k_first, i = 0; k0 <= tile * kTile; k0 += kTile, ++i) {
    const int buffer = arrive_key_tile<kPipelined>(copy_tile, i, k0, tile * kTile);
    if (kDocs && k0 + kTile <= warp_first) continue;  // outside every row's document: dS all 0
    const S* keys = k_s + buffer * kRows;
    const S* values = v_s + buffer * kRows;
    float s[8][4], dp[8][4];
    rows_dot_staged<HS, kPipelined, S>(s, qa, keys, k0, last_key, g, t);
    rows_dot_staged<HS, kPipelined, S>(dp, da, values, k0, last_key, g, t);
    with_mask<kPipelined>(!kDocs && k0 + kTile - 1 <= q0, [&](auto masked) {
      constexpr bool kMasked = decltype(masked)::value;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int key = k0 + 8 * j + 2 * t + (c & 1);
          const bool top = c < 2;
          const bool seen = !kMasked || (key <= (top ? row0 : row1) &&
                                         (!kDocs || key >= (top ? first0 : first1)));
          const float p = seen ? exp2_fast(s[j][c] * scale_log2 - (top ? lse0 : lse1)) : 0.0f;
          s[j][c] = p * (dp[j][c] - (top ? d0 : d1));
        }
      }
    });
    std::uint32_t dsa[4][4];
    to_a<S>(dsa, s);
    const bool skip[4] = {k0 > last_key || (kDocs && k0 + 15 < warp_first),
                          k0 + 16 > last_key || (kDocs && k0 + 31 < warp_first),
                          k0 + 32 > last_key || (kDocs && k0 + 47 < warp_first),
                          k0 + 48 > last_key || (kDocs && k0 + 63 < warp_first)};
    rows_times_staged<HS, COLS, kPipelined, S>(dq, dsa, keys + col0, skip, g, t);
  }
  S* dq0 = dq_out + (static_cast<I64>(b) * T + row0) * q_ld + h * HS + col0;
  S* dq1 = dq_out + (static_cast<I64>(b) * T + row1) * q_ld + h * HS + col0;
  add_rows<COLS>(dq0, dq1, dq, scale, t);
#else
  __trap();
#endif
}

// dK, dV: grid (T/64 key tiles, first tiles first; B*NKV key/value heads; HS/COLS). Warp w owns
// keys tile*64 + 16w .. +16 (the A operand); for each query head of the key/value head's group in
// turn, per query tile from its own on: S^T = K Q^T, dP^T = V dout^T in registers, P^T and dS^T
// from them, dV += P^T dout, dK += dS^T Q (the block's COLS columns of dout and Q). The group's
// sum stays in the fp32 accumulators and is rounded once, so grouped-query attention needs
// neither repeated key/value heads nor atomics (group 1: multi-head attention, one pass). With
// doc_start the query tiles stop at the first whose first query's document starts after the key
// tile (no later query sees its keys), a warp skips the query tiles and chunks whose documents
// all start after its last key, and the rest is masked per element.
template <typename S, int HS, int COLS, bool kDocs, bool kPipelined>
__global__ void __launch_bounds__(kThreads)
    flash_mma_dkdv_kernel(S* dk_out, S* dv_out, const S* dout, const S* q, const S* k, const S* v,
                          int q_ld, int kv_ld, int group, const float* lse, const float* rowdot,
                          int T, int C, int NH, float scale, float scale_log2,
                          const std::int32_t* doc_start, int window) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  constexpr int ld = kLd<HS>;
  constexpr int kRows = kTile * ld;
  // The staged query and dout tiles and, per staged query, its lse (times log2 e when staged, as
  // read when pipelined: an asynchronous copy cannot scale), row term and (kDocs) first key.
  // Pipelined: buffer b of each at + b times its size.
  S* q_s;
  S* dy_s;
  float* lse_s;
  float* d_s;
  std::int32_t* first_s;
  if constexpr (kPipelined) {
    extern __shared__ __align__(16) unsigned char flash_mma_shared[];
    q_s = reinterpret_cast<S*>(flash_mma_shared);
    dy_s = q_s + 2 * kRows;
    lse_s = reinterpret_cast<float*>(dy_s + 2 * kRows);
    d_s = lse_s + 2 * kTile;
    first_s = reinterpret_cast<std::int32_t*>(d_s + 2 * kTile);
  } else {
    __shared__ __align__(16) S q_staged[kRows];
    __shared__ __align__(16) S dy_staged[kRows];
    __shared__ float lse_staged[kTile];
    __shared__ float d_staged[kTile];
    __shared__ std::int32_t first_staged[kDocs ? kTile : 1];
    q_s = q_staged;
    dy_s = dy_staged;
    lse_s = lse_staged;
    d_s = d_staged;
    first_s = first_staged;
  }
  const int tile = blockIdx.x;
  const int NKV = NH / group;
  const int b = static_cast<int>(blockIdx.y) / NKV, kh = static_cast<int>(blockIdx.y) % NKV;
  const int col0 = first_column<HS, COLS>();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int k0w = tile * kTile + warp * 16;
  const int key0 = k0w + g, key1 = k0w + g + 8;
  const int warp_last = k0w + 15;
  const SequenceKeys docs = sequence_keys<kDocs>(doc_start, window, b, T);
  const S* k_base = k + static_cast<I64>(b) * T * kv_ld + kh * HS;
  const S* v_base = v + static_cast<I64>(b) * T * kv_ld + kh * HS;

  std::uint32_t ka[HS / 16][4], va[HS / 16][4];
  load_rows<HS>(ka, k_base + static_cast<I64>(k0w) * kv_ld, kv_ld, g, t);
  load_rows<HS>(va, v_base + static_cast<I64>(k0w) * kv_ld, kv_ld, g, t);
  float dk[COLS / 8][4] = {}, dv[COLS / 8][4] = {};

  // The tiles in order: each query head of the group (member) in turn, its query tiles from the
  // key tile's own on, up to the first whose first query's document starts after the key tile
  // (the tile's own always qualifies: first_key(qb) <= qb). The same for the whole block (qb and
  // the tile are), so every thread reaches each barrier.
  auto reaches_keys = [&](int qb) {
    return qb < T && (!kDocs || first_key<kDocs>(docs, qb) < (tile + 1) * kTile);
  };
  auto copy_tile = [&](int member, int qb, int buffer) {
    const int h = kh * group + member;
    const I64 bh = static_cast<I64>(b) * NH + h;
    stage<HS, kPipelined>(q_s + buffer * kRows, q + (static_cast<I64>(b) * T + qb) * q_ld + h * HS,
                          q_ld);
    stage<HS, kPipelined>(dy_s + buffer * kRows, dout + (static_cast<I64>(b) * T + qb) * C + h * HS,
                          C);
    if (threadIdx.x < kTile) {
      const int r = buffer * kTile + threadIdx.x;
      const I64 row = bh * T + qb + threadIdx.x;
      if constexpr (kPipelined) {
        copy_async4(lse_s + r, lse + row);
        copy_async4(d_s + r, rowdot + row);
        if constexpr (kDocs) {
          // A window's first key is a max of two terms, which an asynchronous copy cannot take:
          // stored by this thread instead (the same barrier publishes it).
          if (docs.window == 0) {
            copy_async4(first_s + r, docs.doc_start + qb + threadIdx.x);
          } else {
            first_s[r] = first_key<kDocs>(docs, qb + threadIdx.x);
          }
        }
      } else {
        lse_s[r] = lse[row] * kLog2e;
        d_s[r] = rowdot[row];
        if constexpr (kDocs) first_s[r] = first_key<kDocs>(docs, qb + threadIdx.x);
      }
    }
  };
  int member = 0, qb = tile * kTile;
  if constexpr (kPipelined) {
    copy_tile(member, qb, 0);
    copy_async_commit();
  }
  for (int i = 0; member < group; ++i) {
    int next_member = member, next_qb = qb + kTile;
    if (!reaches_keys(next_qb)) {
      ++next_member;
      next_qb = tile * kTile;
    }
    const int buffer = arrive_tile<kPipelined>(
        i, next_member < group, [&](int to) { copy_tile(member, qb, to); },
        [&](int to) { copy_tile(next_member, next_qb, to); });
    const S* qs = q_s + buffer * kRows;
    const S* dys = dy_s + buffer * kRows;
    const float* lses = lse_s + buffer * kTile;
    const float* ds = d_s + buffer * kTile;
    const std::int32_t* firsts = first_s + (kDocs ? buffer * kTile : 0);
    // Unless every query's document starts after the warp's keys.
    if (!kDocs || firsts[0] <= warp_last) {
      // Query columns before the warp's first key are masked for all its keys: tiles of 8 that
      // end before k0w are skipped (first + 8j > last fails for none, so test the end instead).
      float st_[8][4], dpt[8][4];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          st_[j][c] = 0.0f;
          dpt[j][c] = 0.0f;
        }
        if (qb + 8 * j + 7 < k0w || (kDocs && firsts[8 * j] > warp_last)) continue;
        if constexpr (kPipelined) {
          const StagedPlace at = rows_dot_tile_place(lane);
          const unsigned q_row = shared_address(qs + at.row * ld + at.col);
          const unsigned dy_row = shared_address(dys + at.row * ld + at.col);
#pragma unroll
          for (int kk = 0; kk < HS / 16; kk += 2) {
            std::uint32_t bq[4], bd[4];
            const unsigned offset = (8 * j * ld + kk * 16) * sizeof(S);
            ldmatrix_x4(bq, q_row + offset);
            ldmatrix_x4(bd, dy_row + offset);
            mma<S>(st_[j], ka[kk], bq[0], bq[1]);
            mma<S>(dpt[j], va[kk], bd[0], bd[1]);
            mma<S>(st_[j], ka[kk + 1], bq[2], bq[3]);
            mma<S>(dpt[j], va[kk + 1], bd[2], bd[3]);
          }
        } else {
#pragma unroll
          for (int kk = 0; kk < HS / 16; ++kk) {
            const S* pq = qs + (8 * j + g) * ld + kk * 16 + 2 * t;
            const S* pd = dys + (8 * j + g) * ld + kk * 16 + 2 * t;
            mma<S>(st_[j], ka[kk], word(pq), word(pq + 8));
            mma<S>(dpt[j], va[kk], word(pd), word(pd + 8));
          }
        }
      }
      // The warp's keys all before the tile's first query (and no documents): every pair seen.
      with_mask<kPipelined>(!kDocs && warp_last <= qb, [&](auto masked) {
        constexpr bool kMasked = decltype(masked)::value;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const int qi = 8 * j + 2 * t + (c & 1);
            const int key = c < 2 ? key0 : key1;
            const bool seen = !kMasked || (key <= qb + qi && (!kDocs || key >= firsts[qi]));
            const float lse_log2 = kPipelined ? lses[qi] * kLog2e : lses[qi];
            const float p = seen ? exp2_fast(st_[j][c] * scale_log2 - lse_log2) : 0.0f;
            st_[j][c] = p;
            dpt[j][c] = p * (dpt[j][c] - ds[qi]);
          }
        }
      });
      std::uint32_t pa[4][4], dsa[4][4];
      to_a<S>(pa, st_);
      to_a<S>(dsa, dpt);
      const bool skip[4] = {qb + 15 < k0w || (kDocs && firsts[0] > warp_last),
                            qb + 31 < k0w || (kDocs && firsts[16] > warp_last),
                            qb + 47 < k0w || (kDocs && firsts[32] > warp_last),
                            qb + 63 < k0w || (kDocs && firsts[48] > warp_last)};
      rows_times_staged<HS, COLS, kPipelined, S>(dv, pa, dys + col0, skip, g, t);
      rows_times_staged<HS, COLS, kPipelined, S>(dk, dsa, qs + col0, skip, g, t);
    }
    member = next_member;
    qb = next_qb;
  }
  const I64 row0 = (static_cast<I64>(b) * T + key0) * kv_ld + kh * HS + col0;
  const I64 row1 = (static_cast<I64>(b) * T + key1) * kv_ld + kh * HS + col0;
  add_rows<COLS>(dk_out + row0, dk_out + row1, dk, scale, t);
  add_rows<COLS>(dv_out + row0, dv_out + row1, dv, 1.0f, t);
#else
  __trap();
#endif
}

// How many output columns one block of each kernel writes, per head size: all of them at 64;
// at 128 as many as keep each kernel's accumulators in registers (ptxas for sm_90, --fmad=false:
// the forward 168 registers, dQ 255, no local memory). dK/dV holds two accumulator sets: with all
// 128 columns it spills 184 bytes a thread, so two blocks take 64 each (255 registers, no
// spill), each recomputing S^T and dP^T: 6 products of the pass's size instead of 4.
template <int HS>
struct ColumnSplit;
template <>
struct ColumnSplit<64> {
  static constexpr int kForward = 64, kDq = 64, kDkdv = 64;
};
template <>
struct ColumnSplit<128> {
  static constexpr int kForward = 128, kDq = 128, kDkdv = 64;
};

template <int HS>
dim3 grid_of(int B, int T, int NH, int cols) {
  return dim3(static_cast<unsigned>(T / kTile), static_cast<unsigned>(B * NH),
              static_cast<unsigned>(HS / cols));
}

// Calls f(std::integral_constant<int, HS>) for the head size C / NH.
template <typename F>
void with_head_size(int C, int NH, F&& f) {
  const int hs = NH > 0 ? C / NH : 0;
  if (NH > 0 && hs * NH == C && hs == 64) {
    f(std::integral_constant<int, 64>{});
  } else if (NH > 0 && hs * NH == C && hs == 128) {
    f(std::integral_constant<int, 128>{});
  } else {
    ZRT_THROW(InvalidArgument, "fused attention (mma): head size C/NH = {}/{} is not 64 or 128", C,
              NH);
  }
}

// Calls f(std::bool_constant<kDocs>): the kernels with documents when doc_start or a window is
// given.
template <typename F>
void with_documents(const std::int32_t* doc_start, int window, F&& f) {
  if (doc_start != nullptr || window > 0) {
    f(std::true_type{});
  } else {
    f(std::false_type{});
  }
}

// Calls f(std::bool_constant<kPipelined>).
template <typename F>
void with_pipelining(bool pipelined, F&& f) {
  if (pipelined) {
    f(std::true_type{});
  } else {
    f(std::false_type{});
  }
}

// Dynamic shared memory of the pipelined kernels (two buffers of each staged tile; the staged
// kernels' is static): the forward's key tile and value tile of COLS columns, dQ's key and value
// tiles, dK/dV's query and dout tiles and three (kDocs; else two) rows of per-query statistics.
template <typename S, int HS, int COLS>
constexpr int forward_shared_bytes() {
  return 2 * kTile * (kLd<HS> + kLd<COLS>)*static_cast<int>(sizeof(S));
}
template <typename S, int HS>
constexpr int dq_shared_bytes() {
  return 2 * 2 * kTile * kLd<HS> * static_cast<int>(sizeof(S));
}
template <typename S, int HS, bool kDocs>
constexpr int dkdv_shared_bytes() {
  return dq_shared_bytes<S, HS>() + 2 * kTile * (kDocs ? 3 : 2) * 4;
}

// Launch geometry's dynamic shared memory: 0 for the staged kernels; the pipelined ones' (above
// the 48 KiB a kernel gets without asking at head size 128) allowed first.
template <bool kPipelined, typename Kernel>
int shared_bytes_for(Kernel kernel, int bytes) {
  if constexpr (!kPipelined) {
    (void)kernel;
    (void)bytes;
    return 0;
  } else {
    ZRT_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    return bytes;
  }
}

}  // namespace

HeadRows packed_head_rows(const void* qkv, DType dtype, int C) {
  const auto* base = static_cast<const char*>(qkv);
  const I64 part = static_cast<I64>(C) * dtype_size(dtype);
  return {base, base + part, base + 2 * part, 3 * C, 3 * C, 1};
}

HeadGradients packed_head_gradients(void* dqkv, DType dtype, int C) {
  auto* base = static_cast<char*>(dqkv);
  const I64 part = static_cast<I64>(C) * dtype_size(dtype);
  return {base, base + part, base + 2 * part};
}

void flash_mma_forward(const Launch& l, DType dtype, void* out, float* lse, const HeadRows& in,
                       int B, int T, int C, int NH, const std::int32_t* doc_start, int window,
                       bool pipelined) {
  ZRT_CHECK(in.group >= 1 && NH % in.group == 0,
            "fused attention (mma): {} query heads in groups of {}", NH, in.group);
  with_head_size(C, NH, [&](auto hs) {
    constexpr int HS = decltype(hs)::value;
    constexpr int COLS = ColumnSplit<HS>::kForward;
    const float scale_log2 = kLog2e / sqrtf(static_cast<float>(HS));
    with_16bit_storage(dtype, "fused attention (mma)", [&](auto s) {
      using S = typename decltype(s)::type;
      with_documents(doc_start, window, [&](auto docs) {
        constexpr bool kDocs = decltype(docs)::value;
        with_pipelining(pipelined, [&](auto pipe) {
          constexpr bool kPipelined = decltype(pipe)::value;
          auto* kernel = flash_mma_forward_kernel<S, HS, COLS, kDocs, kPipelined>;
          const int shared =
              shared_bytes_for<kPipelined>(kernel, forward_shared_bytes<S, HS, COLS>());
          kernel<<<grid_of<HS>(B, T, NH, COLS), kThreads, shared, l.stream>>>(
              static_cast<S*>(out), lse, static_cast<const S*>(in.q), static_cast<const S*>(in.k),
              static_cast<const S*>(in.v), in.q_ld, in.kv_ld, in.group, T, C, NH, scale_log2,
              doc_start, window);
          ZRT_CUDA_LAUNCH_CHECK();
        });
      });
    });
  });
}

void flash_mma_backward(const Launch& l, DType dtype, const HeadGradients& d, const void* dout,
                        const HeadRows& in, const float* lse, const float* rowdot, int B, int T,
                        int C, int NH, const std::int32_t* doc_start, int window, bool pipelined) {
  ZRT_CHECK(in.group >= 1 && NH % in.group == 0,
            "fused attention (mma): {} query heads in groups of {}", NH, in.group);
  with_head_size(C, NH, [&](auto hs) {
    constexpr int HS = decltype(hs)::value;
    constexpr int kDkdv = ColumnSplit<HS>::kDkdv, kDq = ColumnSplit<HS>::kDq;
    const float scale = 1.0f / sqrtf(static_cast<float>(HS));
    const float scale_log2 = scale * kLog2e;
    with_16bit_storage(dtype, "fused attention (mma)", [&](auto s) {
      using S = typename decltype(s)::type;
      const auto* q = static_cast<const S*>(in.q);
      const auto* k = static_cast<const S*>(in.k);
      const auto* v = static_cast<const S*>(in.v);
      const auto* dy = static_cast<const S*>(dout);
      with_documents(doc_start, window, [&](auto docs) {
        constexpr bool kDocs = decltype(docs)::value;
        with_pipelining(pipelined, [&](auto pipe) {
          constexpr bool kPipelined = decltype(pipe)::value;
          // One block per key/value head: it sums its group's query heads itself.
          auto* dkdv = flash_mma_dkdv_kernel<S, HS, kDkdv, kDocs, kPipelined>;
          const int dkdv_shared =
              shared_bytes_for<kPipelined>(dkdv, dkdv_shared_bytes<S, HS, kDocs>());
          dkdv<<<grid_of<HS>(B, T, NH / in.group, kDkdv), kThreads, dkdv_shared, l.stream>>>(
              static_cast<S*>(d.dk), static_cast<S*>(d.dv), dy, q, k, v, in.q_ld, in.kv_ld,
              in.group, lse, rowdot, T, C, NH, scale, scale_log2, doc_start, window);
          ZRT_CUDA_LAUNCH_CHECK();
          auto* dq = flash_mma_dq_kernel<S, HS, kDq, kDocs, kPipelined>;
          const int dq_shared = shared_bytes_for<kPipelined>(dq, dq_shared_bytes<S, HS>());
          dq<<<grid_of<HS>(B, T, NH, kDq), kThreads, dq_shared, l.stream>>>(
              static_cast<S*>(d.dq), dy, q, k, v, in.q_ld, in.kv_ld, in.group, lse, rowdot, T, C,
              NH, scale, scale_log2, doc_start, window);
          ZRT_CUDA_LAUNCH_CHECK();
        });
      });
    });
  });
}

}  // namespace zrt::kernels::cuda
