#include "runtime/comm/quantize.h"

#include <algorithm>
#include <limits>

#include "runtime/common/error.h"
#include "runtime/common/simd.h"

namespace zrt {

namespace {

constexpr std::int64_t kWidenTile = 2048;  // fp32 widening tile kept in L1
// 1.5 * 2^23: (t + kRound) - kRound is t rounded to the nearest integer, ties to even, for
// |t| < 2^22 (the codes are at most ~191 in magnitude before the clamp).
constexpr float kRound = 12582912.0f;
constexpr std::uint32_t kAbsMask = 0x7fffffffu;
constexpr std::uint32_t kInfBits = 0x7f800000u;

// max |x| as the bits of the absolute values: for non-NaN floats their order is the integers'
// order, so an integer max reduction (vectorizable without fast-math) finds it, and any bits at
// or above an infinity's mean a non-finite element.
ZRT_SIMD_BODY std::uint32_t amax_bits_body(const float* x, std::int64_t n) {
  std::uint32_t m = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint32_t b = float_bits(x[i]) & kAbsMask;
    m = b > m ? b : m;
  }
  return m;
}
ZRT_SIMD_DISPATCH(std::uint32_t, amax_bits, (const float* x, std::int64_t n), (x, n),
                  amax_bits_body)

ZRT_SIMD_BODY void quantize_body(const float* x, std::int64_t n, float s, std::int8_t* q) {
  for (std::int64_t i = 0; i < n; ++i) {
    float r = (x[i] / s + kRound) - kRound;
    r = r > 127.0f ? 127.0f : (r < -127.0f ? -127.0f : r);
    q[i] = static_cast<std::int8_t>(static_cast<int>(r));
  }
}
ZRT_SIMD_DISPATCH(void, quantize_span, (const float* x, std::int64_t n, float s, std::int8_t* q),
                  (x, n, s, q), quantize_body)

ZRT_SIMD_BODY void dequantize_body(const std::int8_t* q, std::int64_t n, float s, float* out,
                                   bool add) {
  if (add) {
    for (std::int64_t i = 0; i < n; ++i) out[i] += static_cast<float>(q[i]) * s;
  } else {
    for (std::int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(q[i]) * s;
  }
}
ZRT_SIMD_DISPATCH(void, dequantize_span,
                  (const std::int8_t* q, std::int64_t n, float s, float* out, bool add),
                  (q, n, s, out, add), dequantize_body)

ZRT_SIMD_BODY void narrow_bf16_span_body(const float* in, std::uint16_t* out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = to_bf16(in[i]).bits;
}
ZRT_SIMD_DISPATCH(void, narrow_bf16_span, (const float* in, std::uint16_t* out, std::int64_t n),
                  (in, out, n), narrow_bf16_span_body)

ZRT_SIMD_BODY void divide_body(float* x, std::int64_t n, float divisor) {
  for (std::int64_t i = 0; i < n; ++i) x[i] = x[i] / divisor;
}
ZRT_SIMD_DISPATCH(void, divide_span, (float* x, std::int64_t n, float divisor), (x, n, divisor),
                  divide_body)

// Elements [first, first + n) of `in` as fp32: a pointer into it for fp32, else widened into
// `tile` (n <= kWidenTile).
const float* as_fp32(const void* in, DType dtype, std::int64_t first, std::int64_t n, float* tile) {
  switch (dtype) {
    case DType::kFloat32:
      return static_cast<const float*>(in) + first;
    case DType::kBFloat16: {
      const auto* h = static_cast<const std::uint16_t*>(in) + first;
      for (std::int64_t i = 0; i < n; ++i) tile[i] = bits_float(std::uint32_t{h[i]} << 16);
      return tile;
    }
    default: {
      const auto* h = static_cast<const std::uint16_t*>(in) + first;
      for (std::int64_t i = 0; i < n; ++i) tile[i] = to_float(fp16{h[i]});
      return tile;
    }
  }
}

// Writes n fp32 values to out[first..] in dtype.
void store_from_fp32(const float* v, std::int64_t n, DType dtype, void* out, std::int64_t first) {
  switch (dtype) {
    case DType::kFloat32:
      std::copy(v, v + n, static_cast<float*>(out) + first);
      break;
    case DType::kBFloat16:
      narrow_bf16_span(v, static_cast<std::uint16_t*>(out) + first, n);
      break;
    default: {
      auto* h = static_cast<std::uint16_t*>(out) + first;
      for (std::int64_t i = 0; i < n; ++i) h[i] = to_fp16(v[i]).bits;
      break;
    }
  }
}

}  // namespace

void check_quantize_args(DType dtype, std::int64_t n, std::int64_t block) {
  if (!is_floating(dtype)) {
    ZRT_THROW(InvalidArgument, "int8 block quantization takes fp32, bf16 or fp16, not {}",
              dtype_name(dtype));
  }
  if (block < 1 || n < 0) {
    ZRT_THROW(InvalidArgument, "int8 block quantization of {} elements in blocks of {}", n, block);
  }
}

void quantize_int8_blocks(const void* in, DType dtype, std::int64_t n, std::int64_t block,
                          std::int8_t* q, float* scales) {
  check_quantize_args(dtype, n, block);
  alignas(64) float tile[kWidenTile];
  for (std::int64_t b = 0, first = 0; first < n; ++b, first += block) {
    const std::int64_t len = std::min(block, n - first);
    std::uint32_t amax = 0;
    for (std::int64_t t = 0; t < len; t += kWidenTile) {
      const std::int64_t m = std::min(kWidenTile, len - t);
      amax = std::max(amax, amax_bits(as_fp32(in, dtype, first + t, m, tile), m));
    }
    const float s =
        amax >= kInfBits ? std::numeric_limits<float>::quiet_NaN() : bits_float(amax) / 127.0f;
    scales[b] = s;
    if (!(s > 0.0f)) {  // zeros, a scale that underflowed to 0 (|x| < 2^-143), or NaN
      std::fill(q + first, q + first + len, std::int8_t{0});
      continue;
    }
    for (std::int64_t t = 0; t < len; t += kWidenTile) {
      const std::int64_t m = std::min(kWidenTile, len - t);
      quantize_span(as_fp32(in, dtype, first + t, m, tile), m, s, q + first + t);
    }
  }
}

void dequantize_int8_blocks(const std::int8_t* q, const float* scales, std::int64_t n,
                            std::int64_t block, DType dtype, void* out) {
  check_quantize_args(dtype, n, block);
  alignas(64) float tile[kWidenTile];
  for (std::int64_t b = 0, first = 0; first < n; ++b, first += block) {
    const std::int64_t len = std::min(block, n - first);
    for (std::int64_t t = 0; t < len; t += kWidenTile) {
      const std::int64_t m = std::min(kWidenTile, len - t);
      dequantize_span(q + first + t, m, scales[b], tile, false);
      store_from_fp32(tile, m, dtype, out, first + t);
    }
  }
}

void dequantize_int8_blocks_add(const std::int8_t* q, const float* scales, std::int64_t n,
                                std::int64_t block, float* acc, bool add) {
  check_quantize_args(DType::kFloat32, n, block);
  for (std::int64_t b = 0, first = 0; first < n; ++b, first += block) {
    dequantize_span(q + first, std::min(block, n - first), scales[b], acc + first, add);
  }
}

void narrow_fp32(const float* acc, std::int64_t n, float divisor, DType dtype, void* out) {
  check_quantize_args(dtype, n, 1);
  alignas(64) float tile[kWidenTile];
  for (std::int64_t first = 0; first < n; first += kWidenTile) {
    const std::int64_t m = std::min(kWidenTile, n - first);
    std::copy(acc + first, acc + first + m, tile);
    if (divisor != 1.0f) divide_span(tile, m, divisor);
    store_from_fp32(tile, m, dtype, out, first);
  }
}

}  // namespace zrt
