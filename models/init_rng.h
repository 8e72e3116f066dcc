// Counter-based random numbers for parameter initialisation: every value is a pure function of
// (seed, stream, counter), so a parameter (stream = its index) initialised element by element,
// in any order, by any number of ranks, is the same. splitmix64 mixing + Box-Muller in double.
//
// tests/golden/gen_gpt_golden.py implements the same functions in Python (the golden data is
// computed from weights it generates itself); keep the two in sync. It uses libm's log and cos,
// as counter_normal() does; fill_counter_normal() computes its own, which agree with libm's to
// the float in all but ~2^-29 of the values (and then by one float ulp).
#pragma once

#include <cmath>
#include <cstdint>

#include "runtime/common/cpu_isa.h"

namespace zrt {

constexpr std::uint64_t kGoldenGamma = 0x9E3779B97F4A7C15ull;

// splitmix64's output function: a bijective 64-bit mixer.
constexpr std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The key of a (seed, stream): what every counter of the stream is mixed with.
constexpr std::uint64_t counter_key(std::uint64_t seed, std::uint64_t stream) {
  return mix64(mix64(seed + kGoldenGamma) + stream * kGoldenGamma);
}

// 64 random bits for (seed, stream, counter).
constexpr std::uint64_t counter_hash(std::uint64_t seed, std::uint64_t stream,
                                     std::uint64_t counter) {
  return mix64(counter_key(seed, stream) + (counter + 1) * kGoldenGamma);
}

// Uniform in the open interval (0, 1), 53 bits.
inline double counter_uniform(std::uint64_t seed, std::uint64_t stream, std::uint64_t counter) {
  return (static_cast<double>(counter_hash(seed, stream, counter) >> 11) + 0.5) *
         (1.0 / 9007199254740992.0);
}

// Standard normal (Box-Muller on counters 2*counter and 2*counter+1).
inline double counter_normal(std::uint64_t seed, std::uint64_t stream, std::uint64_t counter) {
  const double u1 = counter_uniform(seed, stream, 2 * counter);
  const double u2 = counter_uniform(seed, stream, 2 * counter + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// out[i] = float(scale * counter_normal(seed, stream, begin + i)) for i in [0, count): the
// initialisation of every model's weights. A 7B model is ~7e9 of these, so they run on the
// host's OpenMP threads (every value depends on its own counter alone: the split changes
// nothing) and in vector registers: log and cos are computed here with IEEE additions,
// multiplications, a division and a square root only (no libm, no fused multiply-add), so every
// ISA path (`isa`; kAuto: active_cpu_isa()) gives the same bits on every machine. They agree
// with libm's to about an ulp of the double, so a value differs from counter_normal's float by
// at most one float ulp, and rarely at all (test_init_rng).
void fill_counter_normal(std::uint64_t seed, std::uint64_t stream, std::int64_t begin,
                         std::int64_t count, double scale, float* out, CpuIsa isa = CpuIsa::kAuto);

// fill_counter_normal's own log and cos, one value at a time (for tests): log(x) for a positive
// normal x; cos(x) for x in [0, 2 pi].
double init_rng_log(double x);
double init_rng_cos(double x);

}  // namespace zrt
