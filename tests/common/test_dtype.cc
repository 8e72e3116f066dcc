// 16-bit float conversions: exhaustive round trips and hand-checked rounding cases.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "runtime/common/dtype.h"
#include "runtime/common/error.h"

using namespace zrt;

TEST_CASE("bf16 round-trips every non-NaN 16-bit pattern exactly") {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const bf16 h{static_cast<std::uint16_t>(b)};
    const float f = to_float(h);
    if (std::isnan(f)) {
      CHECK(std::isnan(to_float(to_bf16(f))));
      continue;
    }
    REQUIRE(to_bf16(f).bits == h.bits);
  }
}

TEST_CASE("fp16 round-trips every non-NaN 16-bit pattern exactly") {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const fp16 h{static_cast<std::uint16_t>(b)};
    const float f = to_float(h);
    if (std::isnan(f)) {
      CHECK(std::isnan(to_float(to_fp16(f))));
      continue;
    }
    REQUIRE(to_fp16(f).bits == h.bits);
  }
}

TEST_CASE("fp16 decodes known values") {
  CHECK(to_float(fp16{0x3c00}) == 1.0f);
  CHECK(to_float(fp16{0xc000}) == -2.0f);
  CHECK(to_float(fp16{0x7bff}) == 65504.0f);
  CHECK(to_float(fp16{0x0001}) == std::ldexp(1.0f, -24));  // smallest subnormal
  CHECK(to_float(fp16{0x0400}) == std::ldexp(1.0f, -14));  // smallest normal
  CHECK(std::isinf(to_float(fp16{0x7c00})));
}

TEST_CASE("fp32 to 16-bit rounds to nearest, ties to even") {
  // 1 + 2^-8 lies exactly between bf16 1.0 (even) and 1.0078125: ties go to 1.0.
  CHECK(to_bf16(1.0f + std::ldexp(1.0f, -8)).bits == 0x3f80);
  // 1 + 3*2^-8 lies between 1.0078125 (odd mantissa) and 1.015625 (even): goes up.
  CHECK(to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)).bits == 0x3f82);
  CHECK(to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)).bits == 0x3f81);
  // fp16: 1 + 2^-11 is a tie -> 1.0; 1 + 3*2^-11 -> 1 + 2^-9.
  CHECK(to_fp16(1.0f + std::ldexp(1.0f, -11)).bits == 0x3c00);
  CHECK(to_fp16(1.0f + 3 * std::ldexp(1.0f, -11)).bits == 0x3c02);
  // Overflow: 65519 rounds to 65504, 65520 to infinity.
  CHECK(to_fp16(65519.0f).bits == 0x7bff);
  CHECK(to_fp16(65520.0f).bits == 0x7c00);
  CHECK(to_fp16(-1e10f).bits == 0xfc00);
  // Subnormals: 2^-25 is a tie between 0 and 2^-24 -> 0; slightly above goes up.
  CHECK(to_fp16(std::ldexp(1.0f, -25)).bits == 0x0000);
  CHECK(to_fp16(std::ldexp(1.5f, -25)).bits == 0x0001);
  CHECK(to_fp16(std::ldexp(3.0f, -25)).bits == 0x0002);  // 1.5 units: tie -> even (2)
  CHECK(to_fp16(-std::ldexp(1.0f, -30)).bits == 0x8000);
  CHECK(std::isnan(to_float(to_fp16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(std::isnan(to_float(to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(std::isinf(to_float(to_bf16(std::numeric_limits<float>::infinity()))));
}

TEST_CASE("fp32 to fp16 matches a double-precision reference on a sweep") {
  // Reference: pick the nearer of the two neighbouring fp16 values (ties to even).
  for (float f = 1e-8f; f < 70000.0f; f *= 1.0013f) {
    const fp16 h = to_fp16(f);
    const double got = to_float(h);
    const double down = h.bits == 0 ? 0.0 : to_float(fp16{static_cast<std::uint16_t>(h.bits - 1)});
    const double up =
        std::isinf(got) ? got : to_float(fp16{static_cast<std::uint16_t>(h.bits + 1)});
    if (std::isinf(got)) {
      REQUIRE(f >= 65520.0f);
      continue;
    }
    REQUIRE(std::abs(got - f) <= std::abs(down - f));
    REQUIRE(std::abs(got - f) <= std::abs(up - f));
  }
}

TEST_CASE("dtype names parse both zrt and DeepSpeed spellings") {
  CHECK(parse_dtype("bf16") == DType::kBFloat16);
  CHECK(parse_dtype("bfloat16") == DType::kBFloat16);
  CHECK(parse_dtype("fp16") == DType::kFloat16);
  CHECK(parse_dtype("float32") == DType::kFloat32);
  CHECK_THROWS_WITH(parse_dtype("fp8"), Catch::Contains("unknown data type 'fp8'"));
  CHECK(dtype_size(DType::kInt64) == 8);
}
