// The weights' random initialisation (models/init_rng.h): fill_counter_normal's own log and cos
// against long double references, its values against counter_normal's (libm's log and cos), and
// the same bits from every ISA path and every thread count.
//
// Tolerances, derived: log_positive's result is e*ln2 (head exact, tail within 2^-53 of its own
// small size) plus log(1+f), whose series is truncated below 2^-54 of the result and whose
// correction terms are small against f, so the rounding is that of the last two additions plus
// a fraction of an ulp: within 2 ulps. cos_to_two_pi's reduction is exact up to one subtraction
// (|r| >= 1e-17 for a double x near k pi/2: pi/2's three parts reach 2^-120), and the series
// (truncated below 2^-54 of the result) round within about an ulp: within 2 ulps. The long
// double references (64-bit significands) are 2^11 times finer. The value then goes through
// sqrt, two products and the float conversion; differing from libm's (itself within an ulp) by
// a few double ulps, the float can differ only where a float rounding boundary falls between
// the two doubles, at most by one float ulp, with probability about 2^-29 per value.
#include <catch2/catch.hpp>

#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "models/init_rng.h"
#include "runtime/common/cpu_isa.h"

namespace zrt {
namespace {

double ulps_apart(double value, long double reference) {
  const double ref = static_cast<double>(reference);
  const double ulp = std::nextafter(std::fabs(ref), INFINITY) - std::fabs(ref);
  return static_cast<double>(std::fabs(static_cast<long double>(value) - reference)) / ulp;
}

std::uint32_t bits_of(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

TEST_CASE("init_rng's log is within 2 ulps of a long double log", "[init_rng]") {
  std::vector<double> inputs = {1.0,
                                std::nextafter(1.0, 0.0),
                                0.5,
                                0.75,
                                0x1p-54,
                                0x1.8p-54,
                                std::sqrt(0.5),
                                std::nextafter(std::sqrt(2.0), 0.0),
                                std::sqrt(2.0),
                                1.5,
                                2.0,
                                1e-300,
                                1e300,
                                3.0};
  // Every uniform the generator makes: (k + 0.5) 2^-53 across (0, 1), densest near 0 and 1.
  for (std::uint64_t k = 1; k < (std::uint64_t{1} << 53); k = k * 3 + 7) {
    inputs.push_back((static_cast<double>(k) + 0.5) * 0x1p-53);
    inputs.push_back(1.0 - static_cast<double>(k) * 0x1p-53);
  }
  for (std::uint64_t i = 0; i < 200000; ++i) {
    inputs.push_back(counter_uniform(5, 9, i));
  }
  double worst = 0.0;
  for (double x : inputs) {
    const double ulps = ulps_apart(init_rng_log(x), std::log(static_cast<long double>(x)));
    if (x == 1.0) {
      CHECK(init_rng_log(x) == 0.0);
      continue;
    }
    INFO("x = " << x);
    CHECK(ulps <= 2.0);
    worst = std::max(worst, ulps);
  }
  WARN("log: worst " << worst << " ulps over " << inputs.size() << " inputs");
}

TEST_CASE("init_rng's cos is within 2 ulps of a long double cos on [0, 2 pi]", "[init_rng]") {
  constexpr double kTwoPi = 6.283185307179586;
  std::vector<double> inputs = {0.0, kTwoPi, 1e-300, 1e-8};
  // Around each k pi/2, where the result is near 0 or the reduction switches quadrant.
  for (int k = 0; k <= 4; ++k) {
    const double at = k * 1.5707963267948966;
    double below = at, above = at;
    for (int i = 0; i < 64; ++i) {
      below = std::nextafter(below, 0.0);
      above = std::nextafter(above, 10.0);
      inputs.push_back(below);
      if (above <= kTwoPi) inputs.push_back(above);
    }
    for (double d = 1e-12; d < 1.0; d *= 3.7) {
      if (at - d >= 0) inputs.push_back(at - d);
      if (at + d <= kTwoPi) inputs.push_back(at + d);
    }
  }
  for (std::uint64_t i = 0; i < 200000; ++i) inputs.push_back(kTwoPi * counter_uniform(3, 4, i));
  double worst = 0.0;
  for (double x : inputs) {
    const long double reference = std::cos(static_cast<long double>(x));
    INFO("x = " << x);
    const double ulps = ulps_apart(init_rng_cos(x), reference);
    CHECK(ulps <= 2.0);
    worst = std::max(worst, ulps);
  }
  WARN("cos: worst " << worst << " ulps over " << inputs.size() << " inputs");
}

TEST_CASE("fill_counter_normal: counter_normal's floats, at most one float ulp apart, rarely",
          "[init_rng]") {
  struct Stream {
    std::uint64_t seed, stream;
    std::int64_t begin;
    double scale;
  };
  const std::vector<Stream> streams = {{1234, 0, 0, 0.02},
                                       {1234, 17, 12345, 0.02},
                                       {7, 3, std::int64_t{1} << 40, 1.0},
                                       {0, 0, 0, 1.0}};
  constexpr std::int64_t kCount = 500000;
  std::int64_t differing = 0, values = 0;
  std::vector<float> out(kCount);
  for (const Stream& s : streams) {
    fill_counter_normal(s.seed, s.stream, s.begin, kCount, s.scale, out.data());
    for (std::int64_t i = 0; i < kCount; ++i) {
      const float expected = static_cast<float>(
          s.scale * counter_normal(s.seed, s.stream, static_cast<std::uint64_t>(s.begin + i)));
      ++values;
      if (bits_of(out[static_cast<std::size_t>(i)]) == bits_of(expected)) continue;
      ++differing;
      INFO("seed " << s.seed << " stream " << s.stream << " counter " << s.begin + i);
      CHECK((out[static_cast<std::size_t>(i)] == std::nextafter(expected, INFINITY) ||
             out[static_cast<std::size_t>(i)] == std::nextafter(expected, -INFINITY)));
    }
  }
  WARN(differing << " of " << values << " values differ from libm's by one float ulp");
  // About 2^-29 of the values are expected to differ; 2^-16 would be a bug in log or cos.
  CHECK(differing <= values / 65536);
}

TEST_CASE("fill_counter_normal: the same bits on every ISA path and thread count", "[init_rng]") {
  constexpr std::int64_t kCount = 300001;  // not a whole number of vectors or pieces
  std::vector<float> reference(kCount);
  fill_counter_normal(99, 5, 1000, kCount, 0.5, reference.data(), CpuIsa::kScalar);
  for (CpuIsa isa : supported_cpu_isas()) {
    for (int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      std::vector<float> out(kCount);
      fill_counter_normal(99, 5, 1000, kCount, 0.5, out.data(), isa);
      INFO(cpu_isa_name(isa) << ", " << threads << " thread(s)");
      CHECK(std::memcmp(out.data(), reference.data(), out.size() * sizeof(float)) == 0);
    }
  }
  // A piece of the stream is the same values as the whole stream at those counters.
  std::vector<float> piece(100);
  fill_counter_normal(99, 5, 1000 + 4095, 100, 0.5, piece.data());
  CHECK(std::memcmp(piece.data(), reference.data() + 4095, piece.size() * sizeof(float)) == 0);
}

}  // namespace
}  // namespace zrt
