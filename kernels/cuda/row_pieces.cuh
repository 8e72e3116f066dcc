// One warp per row, 16-bit storage, 16-byte loads: the shared geometry of the row kernels that
// keep a row in registers (layernorm.cu, rmsnorm.cu). Lane `lane` owns the 8-element pieces
// lane + 32 j (j < NV) of a row of C elements (C % 8 == 0, rows and parameters 16-byte
// aligned); pieces past C are skipped, so a kernel of width NV serves every C <= 256 NV.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include "kernels/cuda/device_math.cuh"

namespace zrt::kernels::cuda {

constexpr int kPiece = 8;  // 16-bit elements per 16-byte load

// Element e of a piece as loaded, in fp32.
template <typename S>
__device__ __forceinline__ float piece_at(const uint4& piece, int e) {
  return ld(reinterpret_cast<const S*>(&piece)[e]);
}

// A lane's pieces of the row at element offset `off`: of a, or with b of res = a + b, each
// element rounded to S as residual_forward rounds it and the pieces stored to res (the fused
// residual add of residual_layernorm_forward / residual_rmsnorm_forward).
template <typename S, int NV>
__device__ __forceinline__ void load_row_pieces(uint4 (&x)[NV], S* res, const S* a, const S* b,
                                                std::int64_t off, int C, int lane) {
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int c0 = (lane + 32 * j) * kPiece;
    if (c0 >= C) continue;
    x[j] = *reinterpret_cast<const uint4*>(a + off + c0);
    if (b != nullptr) {
      const uint4 xb = *reinterpret_cast<const uint4*>(b + off + c0);
      S* pa = reinterpret_cast<S*>(&x[j]);
#pragma unroll
      for (int e = 0; e < kPiece; ++e) pa[e] = st<S>(ld(pa[e]) + piece_at<S>(xb, e));
      *reinterpret_cast<uint4*>(res + off + c0) = x[j];
    }
  }
}

template <typename F, int... Widths>
bool with_width_at_least(int needed, F&& f, std::integer_sequence<int, Widths...>) {
  bool called = false;
  ((called = called || (needed <= Widths && (f(std::integral_constant<int, Widths>{}), true))),
   ...);
  return called;
}

// f(std::integral_constant<int, NV>) for the smallest NV of {1, 2, 3, 4, 6, 8, 12, 16} with
// 256 NV >= C; false (f not called) when C is not a positive multiple of 8 or above 4096.
template <typename F>
bool with_row_pieces(int C, F&& f) {
  if (C <= 0 || C % kPiece != 0) return false;
  return with_width_at_least((C / kPiece + 31) / 32, f,
                             std::integer_sequence<int, 1, 2, 3, 4, 6, 8, 12, 16>{});
}

}  // namespace zrt::kernels::cuda
