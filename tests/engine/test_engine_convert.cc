// The CPU conversion fp32 -> bf16 (engine_kernels::cpu::convert and convert_on_host_threads),
// a vectorized loop with its own copy of the rounding, against a rounding computed another way:
// the two bf16 neighbours of each value, the nearer one chosen in double arithmetic (exact for
// two floats' distances), ties to the even one. Values: every sign/exponent/top-mantissa half
// (the 65 536 bf16 patterns) with the low half at each rounding edge (0, 1, just below a tie,
// the tie, just above, all ones) and pseudo-random low halves, so every exponent, subnormals,
// the overflow to infinity, infinities and NaN payloads come through. Labelled NUMERICS: CI runs
// it at each ISA path (ZRT_CPU_ISA).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "runtime/common/dtype.h"
#include "runtime/engine/engine_kernels.h"

using namespace zrt;

namespace {

float float_from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// Nearest bf16, ties to even, without to_bf16's integer trick. NaN: the sign and the top seven
// payload bits kept, made quiet (what a hardware conversion yields, and what to_bf16 promises).
std::uint16_t reference_bf16(std::uint32_t u) {
  const float f = float_from_bits(u);
  if (std::isnan(f)) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  const std::uint32_t down = u & 0xffff0000u;  // truncated towards zero
  if (down == u) return static_cast<std::uint16_t>(u >> 16);
  // The next bf16 away from zero; from the largest finite one that is infinity.
  const std::uint32_t up = down + 0x10000u;
  // Magnitudes: the next bf16 past the largest finite one is infinity, which IEEE rounding
  // treats as 2^128 for this choice (so the largest float rounds up to infinity).
  const double magnitude = std::fabs(static_cast<double>(f));
  const float up_value = float_from_bits(up);
  const double below = magnitude - std::fabs(static_cast<double>(float_from_bits(down)));
  const double above =
      (std::isinf(up_value) ? std::ldexp(1.0, 128) : std::fabs(static_cast<double>(up_value))) -
      magnitude;
  if (below < above) return static_cast<std::uint16_t>(down >> 16);
  if (above < below) return static_cast<std::uint16_t>(up >> 16);
  return static_cast<std::uint16_t>(((down >> 16) & 1u) ? up >> 16 : down >> 16);
}

std::vector<std::uint32_t> edge_patterns() {
  const std::uint32_t lows[] = {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu};
  std::vector<std::uint32_t> out;
  std::uint32_t state = 0x9e3779b9u;
  for (std::uint32_t high = 0; high < 0x10000u; ++high) {
    for (const std::uint32_t low : lows) out.push_back(high << 16 | low);
    state = state * 1664525u + 1013904223u;  // a fixed LCG: the same values on every machine
    out.push_back(high << 16 | (state >> 16));
  }
  return out;
}

}  // namespace

TEST_CASE("the reference rounding agrees with hand-worked cases") {
  CHECK(reference_bf16(bits_of(1.0f)) == 0x3f80);
  CHECK(reference_bf16(bits_of(1.0f + std::ldexp(1.0f, -8))) == 0x3f80);      // tie -> even
  CHECK(reference_bf16(bits_of(1.0f + 3 * std::ldexp(1.0f, -8))) == 0x3f82);  // tie -> even
  CHECK(reference_bf16(0x3f808001u) == 0x3f81);                               // above the tie
  CHECK(reference_bf16(0x7f7fffffu) == 0x7f80);  // FLT_MAX rounds up to infinity
  CHECK(reference_bf16(0x7f7f7fffu) == 0x7f7f);  // below the tie stays finite
  CHECK(reference_bf16(0x7f800000u) == 0x7f80);
  CHECK(reference_bf16(0xff800001u) == 0xffc0);  // a signalling NaN comes back quiet
  CHECK(reference_bf16(0x00008000u) == 0x0000);  // a subnormal tie goes to the even zero
  CHECK(reference_bf16(0x00018000u) == 0x0002);
}

TEST_CASE("convert fp32 -> bf16 rounds every edge pattern as the reference does") {
  const std::vector<std::uint32_t> patterns = edge_patterns();
  const auto n = static_cast<std::int64_t>(patterns.size());
  std::vector<float> src(patterns.size());
  for (std::size_t i = 0; i < patterns.size(); ++i) src[i] = float_from_bits(patterns[i]);

  // The whole run, then every start offset and length below two vector widths, so the loop's
  // head, vector body and tail all see the edge values.
  std::vector<bf16> dst(patterns.size());
  engine_kernels::cpu::convert(src.data(), DType::kFloat32, dst.data(), DType::kBFloat16, n);
  std::int64_t mismatches = 0;
  for (std::size_t i = 0; i < patterns.size(); ++i) {
    const std::uint16_t want = reference_bf16(patterns[i]);
    if (dst[i].bits != want || to_bf16(src[i]).bits != want) {
      if (++mismatches <= 10)
        WARN("pattern 0x" << std::hex << patterns[i] << ": convert 0x" << dst[i].bits
                          << ", to_bf16 0x" << to_bf16(src[i]).bits << ", reference 0x" << want);
    }
  }
  CHECK(mismatches == 0);

  for (std::int64_t offset = 0; offset < 33; ++offset) {
    for (std::int64_t length = 0; length < 70; ++length) {
      std::vector<bf16> piece(static_cast<std::size_t>(length) + 1, bf16{0xabcd});
      engine_kernels::cpu::convert(src.data() + offset * 997, DType::kFloat32, piece.data(),
                                   DType::kBFloat16, length);
      for (std::int64_t i = 0; i < length; ++i)
        REQUIRE(piece[static_cast<std::size_t>(i)].bits ==
                reference_bf16(patterns[static_cast<std::size_t>(offset * 997 + i)]));
      REQUIRE(piece.back().bits == 0xabcd);  // nothing written past the end
    }
  }
}

TEST_CASE("convert_on_host_threads gives convert's bits at any length") {
  const std::vector<std::uint32_t> patterns = edge_patterns();
  std::vector<float> src(patterns.size());
  for (std::size_t i = 0; i < patterns.size(); ++i) src[i] = float_from_bits(patterns[i]);
  // Lengths around the 256K-value pieces the threads take, and the whole set (~1.8 pieces).
  for (const std::int64_t n : {std::int64_t{1}, std::int64_t{262143}, std::int64_t{262144},
                               std::int64_t{262145}, static_cast<std::int64_t>(src.size())}) {
    std::vector<bf16> threaded(static_cast<std::size_t>(n) + 1, bf16{0xabcd});
    engine_kernels::cpu::convert_on_host_threads(src.data(), DType::kFloat32, threaded.data(),
                                                 DType::kBFloat16, n);
    for (std::int64_t i = 0; i < n; ++i)
      REQUIRE(threaded[static_cast<std::size_t>(i)].bits ==
              reference_bf16(patterns[static_cast<std::size_t>(i)]));
    REQUIRE(threaded.back().bits == 0xabcd);
  }
}
