// Block-wise symmetric int8 quantization for the quantized collectives (ZeRO++'s qwZ weight
// all-gather and qgZ gradient reduce-scatter, quantized_collectives.h). CPU kernels here
// (AVX-512 / AVX2 / scalar via ZRT_SIMD_DISPATCH); cuda_quantize_kernels.h has the CUDA twins,
// which give bit-identical results.
//
// n elements are cut into blocks of `block` consecutive elements (the last block holds the rest).
// A block b with a = max |x| over it has the fp32 scale s = fl(a / 127) and the codes
// q[i] = rint(fl(x[i] / s)) (round half to even) clamped to [-127, 127]; it dequantizes to
// x'[i] = fl(q[i] * s). Every step is one correctly rounded fp32 operation, so the CPU paths and
// the CUDA kernels agree bit for bit.
//
// Error bound, per element, with u = 2^-24 (fp32's unit roundoff) and s the block's stored scale:
//   |x - x'| <= s * (1/2 + 255 u) + 2^-142
// Derivation: in the normal range s = (a/127)(1+d0), so |x/s| <= 127/(1-u) and
// t = fl(x/s) is within u|x/s| of x/s; |rint(t) - t| <= 1/2 (so q never reaches the clamp:
// t < 127.5); the product q*s is rounded once, adding at most 127 s u. Hence
// |x - x'| <= s (|x/s| u + 1/2 + 127 u) <= s (1/2 + 254.0001 u). If a/127 is subnormal, s is off
// by at most 2^-150 absolute; t may then exceed 127.5 and be clamped, which costs at most
// 127 * 2^-150 < 2^-142. Dequantizing to bf16 / fp16 adds that format's rounding:
// |x'| * 2^-8 (bf16) or 2^-11 (fp16), plus half its smallest subnormal (2^-134 / 2^-25).
//
// Special blocks: all zeros (a = 0) give s = 0 and q = 0, dequantized exactly to 0. A block
// holding an infinity or a NaN gets s = NaN and q = 0, so every element of it dequantizes to NaN:
// a non-finite value is propagated (to the whole block), never turned into a finite number, so
// the engine's non-finite check still sees a poisoned gradient after a quantized reduction.
#pragma once

#include <cstdint>

#include "runtime/common/dtype.h"

namespace zrt {

// Number of blocks (scales) of n elements in blocks of `block`.
constexpr std::int64_t quantized_block_count(std::int64_t n, std::int64_t block) {
  return (n + block - 1) / block;
}

// q (n codes) and scales (quantized_block_count(n, block)) from n elements of dtype (fp32,
// bf16 or fp16). Throws InvalidArgument for other dtypes, block < 1 or n < 0.
void quantize_int8_blocks(const void* in, DType dtype, std::int64_t n, std::int64_t block,
                          std::int8_t* q, float* scales);
// out (n elements of dtype) = q[i] * scale of its block, rounded to dtype.
void dequantize_int8_blocks(const std::int8_t* q, const float* scales, std::int64_t n,
                            std::int64_t block, DType dtype, void* out);
// acc[i] = fl(acc[i] + fl(q[i] * scale)) when add, else fl(q[i] * scale): the fp32 sums of the
// quantized reduce-scatter.
void dequantize_int8_blocks_add(const std::int8_t* q, const float* scales, std::int64_t n,
                                std::int64_t block, float* acc, bool add);
// out (n elements of dtype) = fl(acc[i] / divisor) rounded to dtype (no division when divisor
// is 1): the last step of the quantized reduce-scatter (divisor = ranks for an average).
void narrow_fp32(const float* acc, std::int64_t n, float divisor, DType dtype, void* out);

// Checks shared with the CUDA twins: dtype is fp32 / bf16 / fp16, block >= 1, n >= 0.
void check_quantize_args(DType dtype, std::int64_t n, std::int64_t block);

}  // namespace zrt
