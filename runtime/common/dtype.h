// Element types zrt moves and computes with, and exact conversions between fp32 and the two
// 16-bit float formats (round to nearest even, NaN kept NaN, infinities and subnormals kept).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace zrt {

enum class DType : std::uint8_t { kFloat32, kBFloat16, kFloat16, kInt32, kInt64 };

// Bytes per element.
constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::kFloat32:
      return 4;
    case DType::kBFloat16:
      return 2;
    case DType::kFloat16:
      return 2;
    case DType::kInt32:
      return 4;
    case DType::kInt64:
      return 8;
  }
  return 0;
}

// "fp32", "bf16", "fp16", "int32", "int64".
const char* dtype_name(DType t);
// Accepts the names above plus DeepSpeed's spellings ("float32", "bfloat16", "float16", "fp32"...).
// Throws InvalidArgument for anything else.
DType parse_dtype(const std::string& name);
constexpr bool is_float16(DType t) {
  return t == DType::kBFloat16 || t == DType::kFloat16;
}
constexpr bool is_floating(DType t) {
  return t == DType::kFloat32 || is_float16(t);
}

// Storage types. They are plain 16-bit words; arithmetic happens in fp32.
struct bf16 {
  std::uint16_t bits;
};
struct fp16 {
  std::uint16_t bits;
};

inline std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline float to_float(bf16 h) {
  return bits_float(static_cast<std::uint32_t>(h.bits) << 16);
}

inline bf16 to_bf16(float f) {
  const std::uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep it quiet and NaN after truncation
    return bf16{static_cast<std::uint16_t>((u >> 16) | 0x0040u)};
  }
  const std::uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);  // nearest, ties to even
  return bf16{static_cast<std::uint16_t>((u + rounding) >> 16)};
}

inline float to_float(fp16 h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h.bits & 0x8000u) << 16;
  const std::uint32_t exponent = (h.bits >> 10) & 0x1fu;
  std::uint32_t mantissa = h.bits & 0x3ffu;
  if (exponent == 0x1f) return bits_float(sign | 0x7f800000u | (mantissa << 13));  // inf/NaN
  if (exponent != 0) return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  if (mantissa == 0) return bits_float(sign);  // signed zero
  // Subnormal: value = mantissa * 2^-24, exact in fp32.
  const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-08f;
  return sign ? -magnitude : magnitude;
}

inline fp16 to_fp16(float f) {
  const std::uint32_t u = float_bits(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return fp16{static_cast<std::uint16_t>(sign | 0x7e00u)};   // NaN
  if (abs >= 0x477ff000u) return fp16{static_cast<std::uint16_t>(sign | 0x7c00u)};  // >= 65520: inf
  if (abs < 0x38800000u) {
    // Result is subnormal (or zero): scale to units of 2^-24 and round to nearest even.
    if (abs < 0x33000000u) return fp16{sign};  // below half the smallest subnormal
    const std::uint32_t exponent = abs >> 23;
    const std::uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - exponent;  // 14..24
    std::uint32_t value = mantissa >> shift;
    const std::uint32_t remainder = mantissa & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1u);
    if (remainder > half || (remainder == half && (value & 1u))) ++value;
    return fp16{static_cast<std::uint16_t>(sign | value)};
  }
  // Normal: rebias exponent (127 -> 15) and round the 13 dropped mantissa bits to nearest even.
  const std::uint32_t rebased = abs - (112u << 23);
  const std::uint32_t rounded = rebased + 0xfffu + ((rebased >> 13) & 1u);
  return fp16{static_cast<std::uint16_t>(sign | (rounded >> 13))};
}

// Generic conversions used by templated code.
template <typename T>
inline float load_as_float(T v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    return to_float(v);
  }
}
template <typename T>
inline T store_from_float(float f) {
  if constexpr (std::is_same_v<T, float>) {
    return f;
  } else if constexpr (std::is_same_v<T, bf16>) {
    return to_bf16(f);
  } else {
    return to_fp16(f);
  }
}

}  // namespace zrt
