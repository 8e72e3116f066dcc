#include "models/init_rng.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "runtime/common/error.h"
#include "runtime/common/simd.h"

namespace zrt {

namespace {

// ln 2 as a 32-bit head (so e * kLn2Hi is exact for |e| < 2^21) and the rest.
constexpr double kLn2Hi = 0x1.62e42fee00000p-1;
constexpr double kLn2Lo = 0x1.a39ef35793c76p-33;
// pi / 2 in three parts, the first two of 33 bits (k * part exact for k < 2^20).
constexpr double kPio2Part1 = 0x1.921fb54400000p+0;
constexpr double kPio2Part2 = 0x1.0b4611a600000p-34;
constexpr double kPio2Part3 = 0x1.3198a2e037073p-69;
constexpr double kTwoOverPi = 0x1.45f306dc9c883p-1;
constexpr double kSqrt2 = 0x1.6a09e667f3bcdp+0;
constexpr double kTwoPi = 6.283185307179586;  // counter_normal's constant

ZRT_SIMD_BODY std::uint64_t bits_of(double d) {
  std::uint64_t b;
  std::memcpy(&b, &d, sizeof b);
  return b;
}

ZRT_SIMD_BODY double double_of(std::uint64_t b) {
  double d;
  std::memcpy(&d, &b, sizeof d);
  return d;
}

// double(v) for v < 2^53, exact, through two int32 conversions (a vector int64 -> double
// conversion needs AVX-512DQ).
ZRT_SIMD_BODY double exact_double_53(std::uint64_t v) {
  const auto high = static_cast<std::int32_t>(v >> 26);
  const auto low = static_cast<std::int32_t>(v & ((std::uint64_t{1} << 26) - 1));
  return static_cast<double>(high) * 0x1p26 + static_cast<double>(low);
}

// counter_uniform() from counter_hash()'s bits: the same expression, the same double.
ZRT_SIMD_BODY double uniform_of(std::uint64_t hash) {
  return (exact_double_53(hash >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

// log(x) for a positive normal x. x = 2^e * m with m in [sqrt(1/2), sqrt(2)), f = m - 1
// (exact), s = f / (2 + f): log(1 + f) = 2 atanh(s) = f - (f^2/2 - s (f^2/2 + R)), where
// R = sum_k 2 s^(2k) / (2k + 1); in this form the rounding of s reaches only the small terms.
// Nine terms of R leave a truncation under 2^-54 of the result (|s| <= 0.1716).
ZRT_SIMD_BODY double log_positive(double x) {
  const std::uint64_t bits = bits_of(x);
  const auto biased = static_cast<std::int32_t>(bits >> 52);
  double m = double_of((bits & 0x000fffffffffffffull) | 0x3ff0000000000000ull);  // [1, 2)
  // Selections as arithmetic (a product by 1 or 0.5, exact): AVX2 code has no masked moves,
  // and a select there keeps the loop from vectorizing.
  const std::int32_t high = m > kSqrt2 ? 1 : 0;
  m *= 1.0 - 0.5 * static_cast<double>(high);
  const double e = static_cast<double>(biased - 1023 + high);
  const double f = m - 1.0;
  const double s = f / (2.0 + f);
  const double z = s * s;
  const double r =
      z *
      (2.0 / 3 +
       z * (2.0 / 5 +
            z * (2.0 / 7 +
                 z * (2.0 / 9 +
                      z * (2.0 / 11 +
                           z * (2.0 / 13 + z * (2.0 / 15 + z * (2.0 / 17 + z * (2.0 / 19)))))))));
  const double half_f_squared = 0.5 * f * f;
  return e * kLn2Hi + (f - (half_f_squared - (s * (half_f_squared + r) + e * kLn2Lo)));
}

// cos(x) for x in [0, 2 pi]: x = k pi/2 + r with |r| <= pi/4 (Cody-Waite with pi/2 in three
// parts; x - k * part1 is exact), then sin(r) or cos(r) by their Taylor series through r^17 and
// r^16 (the first omitted terms under 2^-54 of the result at pi/4), the sign by k.
ZRT_SIMD_BODY double cos_to_two_pi(double x) {
  const auto k = static_cast<std::int32_t>(x * kTwoOverPi + 0.5);  // x >= 0: truncation rounds
  const double dk = static_cast<double>(k);
  const double r = ((x - dk * kPio2Part1) - dk * kPio2Part2) - dk * kPio2Part3;
  const double z = r * r;
  const double sin_r =
      r + r * z *
              (-1.0 / 6 +
               z * (1.0 / 120 +
                    z * (-1.0 / 5040 +
                         z * (1.0 / 362880 +
                              z * (-1.0 / 39916800 +
                                   z * (1.0 / 6227020800 + z * (-1.0 / 1307674368000 +
                                                                z * (1.0 / 355687428096000))))))));
  const double tail =
      z * z *
      (1.0 / 24 +
       z * (-1.0 / 720 +
            z * (1.0 / 40320 +
                 z * (-1.0 / 3628800 + z * (1.0 / 479001600 + z * (-1.0 / 87178291200 +
                                                                   z * (1.0 / 20922789888000)))))));
  // 1 - z/2 + tail, with the rounding of 1 - z/2 carried into the tail.
  const double half_z = 0.5 * z;
  const double head = 1.0 - half_z;
  const double cos_r = head + (((1.0 - head) - half_z) + tail);
  // cos(r + k pi/2): cos, -sin, -cos, sin for k mod 4 = 0..3, as exact products by 0, 1, -1
  // (r is never -0: a zero sine is +0).
  const double odd = static_cast<double>(k & 1);
  const double sign = 1.0 - static_cast<double>((k + 1) & 2);
  return sign * (odd * sin_r + (1.0 - odd) * cos_r);
}

ZRT_SIMD_BODY void fill_body(std::uint64_t key, std::int64_t begin, std::int64_t count,
                             double scale, float* out) {
  for (std::int64_t i = 0; i < count; ++i) {
    const std::uint64_t counter = 2 * static_cast<std::uint64_t>(begin + i);
    const double u1 = uniform_of(mix64(key + (counter + 1) * kGoldenGamma));
    const double u2 = uniform_of(mix64(key + (counter + 2) * kGoldenGamma));
    const double normal = std::sqrt(-2.0 * log_positive(u1)) * cos_to_two_pi(kTwoPi * u2);
    out[i] = static_cast<float>(scale * normal);
  }
}

ZRT_SIMD_VARIANTS(void, fill,
                  (std::uint64_t key, std::int64_t begin, std::int64_t count, double scale,
                   float* out),
                  (key, begin, count, scale, out), fill_body)

void fill_on(CpuIsa isa, std::uint64_t key, std::int64_t begin, std::int64_t count, double scale,
             float* out) {
  switch (isa) {
    case CpuIsa::kAvx512:
      return fill_avx512(key, begin, count, scale, out);
    case CpuIsa::kAvx2:
      return fill_avx2(key, begin, count, scale, out);
    default:
      return fill_baseline(key, begin, count, scale, out);
  }
}

}  // namespace

double init_rng_log(double x) {
  return log_positive(x);
}

double init_rng_cos(double x) {
  return cos_to_two_pi(x);
}

void fill_counter_normal(std::uint64_t seed, std::uint64_t stream, std::int64_t begin,
                         std::int64_t count, double scale, float* out, CpuIsa isa) {
  if (isa == CpuIsa::kAuto) isa = active_cpu_isa();
  ZRT_CHECK(cpu_isa_supported(isa), "fill_counter_normal: this CPU cannot run the {} path",
            cpu_isa_name(isa));
  const std::uint64_t key = counter_key(seed, stream);
  // Pieces of 4096 values; below 16 pieces a thread team costs more than it saves.
  constexpr std::int64_t kPiece = 4096;
  const std::int64_t pieces = (count + kPiece - 1) / kPiece;
#pragma omp parallel for schedule(static) if (pieces >= 16)
  for (std::int64_t p = 0; p < pieces; ++p) {
    const std::int64_t first = p * kPiece;
    fill_on(isa, key, begin + first, std::min(kPiece, count - first), scale, out + first);
  }
}

}  // namespace zrt
