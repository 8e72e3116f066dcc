// Block-wise int8 quantization (runtime/comm/quantize.h): the derived per-element error bound on
// every dtype, block size and magnitude (normal, tiny, huge), the codes and scales against a
// scalar reference (so every SIMD path must agree: CI runs this on AVX-512, AVX2 and scalar),
// the bound's tightness, and the special blocks (zeros, inf / NaN, a short tail).
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "runtime/comm/quantize.h"
#include "runtime/common/error.h"

using namespace zrt;

namespace {

constexpr double kU = 1.0 / (1 << 24);  // fp32 unit roundoff

std::vector<float> random_values(std::int64_t n, float magnitude, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = dist(rng) * magnitude;
  return v;
}

// The values as dtype bits (rounded) and back as fp32: what the kernel actually sees.
std::vector<std::uint16_t> to_bits(const std::vector<float>& v, DType dtype) {
  std::vector<std::uint16_t> out;
  for (float x : v) out.push_back(dtype == DType::kBFloat16 ? to_bf16(x).bits : to_fp16(x).bits);
  return out;
}
float from_bits(std::uint16_t h, DType dtype) {
  return dtype == DType::kBFloat16 ? to_float(bf16{h}) : to_float(fp16{h});
}

struct Rounding {
  double relative;  // unit roundoff of the output format (0 for fp32)
  double absolute;  // half its smallest subnormal
};
Rounding output_rounding(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16:
      return {1.0 / 256, std::ldexp(1.0, -134)};
    case DType::kFloat16:
      return {1.0 / 2048, std::ldexp(1.0, -25)};
    default:
      return {0.0, 0.0};
  }
}

// Quantizes and dequantizes n values of dtype in blocks of `block`, checks scales and codes
// against the scalar definition and every element against the bound; returns the largest
// error / scale seen (to show the bound is tight).
double check_round_trip(const std::vector<float>& values, DType dtype, std::int64_t block) {
  const auto n = static_cast<std::int64_t>(values.size());
  std::vector<float> x = values;  // what the kernel sees, as fp32
  std::vector<std::uint16_t> bits;
  const void* in = x.data();
  if (dtype != DType::kFloat32) {
    bits = to_bits(values, dtype);
    for (std::int64_t i = 0; i < n; ++i) x[i] = from_bits(bits[i], dtype);
    in = bits.data();
  }
  std::vector<std::int8_t> q(static_cast<std::size_t>(n));
  std::vector<float> scales(static_cast<std::size_t>(quantized_block_count(n, block)));
  quantize_int8_blocks(in, dtype, n, block, q.data(), scales.data());
  std::vector<std::byte> out(static_cast<std::size_t>(n * 4));
  dequantize_int8_blocks(q.data(), scales.data(), n, block, dtype, out.data());
  const Rounding rounding = output_rounding(dtype);
  double worst = 0.0;
  for (std::int64_t b = 0; b * block < n; ++b) {
    const std::int64_t first = b * block;
    const std::int64_t len = std::min(block, n - first);
    float a = 0.0f;
    for (std::int64_t i = first; i < first + len; ++i) a = std::max(a, std::fabs(x[i]));
    const float s = a / 127.0f;
    INFO("block " << b << " of " << len << " elements, max " << a);
    REQUIRE(float_bits(scales[b]) == float_bits(s));
    for (std::int64_t i = first; i < first + len; ++i) {
      const float expect_q =
          s > 0.0f ? std::min(127.0f, std::max(-127.0f, std::nearbyint(x[i] / s))) : 0.0f;
      REQUIRE(q[i] == static_cast<int>(expect_q));
      float got = 0.0f;
      if (dtype == DType::kFloat32) {
        std::memcpy(&got, out.data() + i * 4, 4);
      } else {
        std::uint16_t h;
        std::memcpy(&h, out.data() + i * 2, 2);
        got = from_bits(h, dtype);
      }
      const double error = std::fabs(static_cast<double>(x[i]) - got);
      const double bound =
          s * (0.5 + 255 * kU) + std::ldexp(1.0, -142) + a * rounding.relative + rounding.absolute;
      INFO("element " << i << " x " << x[i] << " got " << got << " scale " << s);
      REQUIRE(error <= bound);
      if (s > 0.0f) worst = std::max(worst, error / s);
    }
  }
  return worst;
}

}  // namespace

TEST_CASE("quantize round trip within the derived bound: dtypes, block sizes, magnitudes") {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (std::int64_t block : {std::int64_t{1}, std::int64_t{7}, std::int64_t{256},
                               std::int64_t{2048}, std::int64_t{5000}}) {
      // fp16 cannot hold 1e30 or 1e-30; its range is checked with its own extremes.
      const std::vector<float> magnitudes =
          dtype == DType::kFloat16 ? std::vector<float>{1.0f, 60000.0f, 1e-4f}
                                   : std::vector<float>{1.0f, 3e38f, 1e-30f, 1e-38f, 1e-44f};
      for (float magnitude : magnitudes) {
        INFO(dtype_name(dtype) << " block " << block << " magnitude " << magnitude);
        const double worst = check_round_trip(random_values(4099, magnitude, 7), dtype, block);
        // Not vacuous: with many elements per block some error comes close to s/2 (for blocks of
        // one element the code is exactly +-127 and the error tiny).
        if (block >= 256 && magnitude >= 1e-30f) CHECK(worst > 0.4);
      }
    }
  }
}

TEST_CASE("zeros give scale 0 and dequantize exactly; a short tail has its own scale") {
  std::vector<float> x(256 * 2 + 3, 0.0f);
  x[256 * 2 + 1] = -2.54f;  // only the 3-element tail is non-zero
  std::vector<std::int8_t> q(x.size());
  std::vector<float> scales(3);
  quantize_int8_blocks(x.data(), DType::kFloat32, static_cast<std::int64_t>(x.size()), 256,
                       q.data(), scales.data());
  CHECK(scales[0] == 0.0f);
  CHECK(scales[1] == 0.0f);
  CHECK(scales[2] == 2.54f / 127.0f);
  CHECK(q[256 * 2 + 1] == -127);
  CHECK(q[256 * 2] == 0);
  std::vector<float> back(x.size(), 1.0f);
  dequantize_int8_blocks(q.data(), scales.data(), static_cast<std::int64_t>(x.size()), 256,
                         DType::kFloat32, back.data());
  for (std::size_t i = 0; i < 512; ++i) REQUIRE(float_bits(back[i]) == 0u);
  CHECK(back[256 * 2 + 1] == -127.0f * (2.54f / 127.0f));
}

TEST_CASE("a block with inf or NaN dequantizes to NaN throughout; other blocks are untouched") {
  for (float poison :
       {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
        std::numeric_limits<float>::quiet_NaN()}) {
    std::vector<float> x = random_values(300, 1.0f, 3);
    x[150] = poison;  // block 1 of [0, 100), [100, 200), [200, 300)
    std::vector<std::int8_t> q(300);
    std::vector<float> scales(3);
    quantize_int8_blocks(x.data(), DType::kFloat32, 300, 100, q.data(), scales.data());
    CHECK(std::isnan(scales[1]));
    CHECK(std::isfinite(scales[0]));
    CHECK(std::isfinite(scales[2]));
    std::vector<float> back(300);
    dequantize_int8_blocks(q.data(), scales.data(), 300, 100, DType::kFloat32, back.data());
    for (int i = 0; i < 300; ++i) {
      INFO("element " << i);
      REQUIRE(std::isnan(back[i]) == (i >= 100 && i < 200));
    }
    // The fp32 accumulation keeps the poison too.
    std::vector<float> acc(300, 1.0f);
    dequantize_int8_blocks_add(q.data(), scales.data(), 300, 100, acc.data(), true);
    CHECK(std::isnan(acc[100]));
    CHECK(std::isfinite(acc[99]));
  }
}

TEST_CASE("dequantize_add accumulates fl(acc + fl(q * s)); narrow_fp32 divides then rounds") {
  const std::vector<float> x = random_values(1000, 3.0f, 11);
  std::vector<std::int8_t> q(1000);
  std::vector<float> scales(4);
  quantize_int8_blocks(x.data(), DType::kFloat32, 1000, 256, q.data(), scales.data());
  std::vector<float> acc = random_values(1000, 1.0f, 12);
  const std::vector<float> before = acc;
  dequantize_int8_blocks_add(q.data(), scales.data(), 1000, 256, acc.data(), true);
  for (int i = 0; i < 1000; ++i) {
    const float term = static_cast<float>(q[i]) * scales[i / 256];
    REQUIRE(float_bits(acc[i]) == float_bits(before[i] + term));
  }
  std::vector<std::uint16_t> h(1000);
  narrow_fp32(acc.data(), 1000, 3.0f, DType::kBFloat16, h.data());
  for (int i = 0; i < 1000; ++i) REQUIRE(h[i] == to_bf16(acc[i] / 3.0f).bits);
}

TEST_CASE("quantization refuses integer dtypes and empty blocks, naming them") {
  std::int8_t q[4];
  float s[4];
  const std::int32_t ints[4] = {1, 2, 3, 4};
  CHECK_THROWS_AS(quantize_int8_blocks(ints, DType::kInt32, 4, 2, q, s), InvalidArgument);
  CHECK_THROWS_WITH(quantize_int8_blocks(ints, DType::kInt32, 4, 2, q, s),
                    Catch::Contains("takes fp32, bf16 or fp16, not int32"));
  CHECK_THROWS_WITH(quantize_int8_blocks(ints, DType::kFloat32, 4, 0, q, s),
                    Catch::Contains("4 elements in blocks of 0"));
}
