// Shared helpers of the CPU kernels: the accumulation type of each storage type, loads and
// stores through it, and conversions of whole arrays.
//
// Storage types: float and double compute in themselves (double exists for finite-difference
// checks); zrt::bf16 and zrt::fp16 are storage only and compute in fp32.
#pragma once

#include <cstdint>
#include <type_traits>

#include "runtime/common/dtype.h"

namespace zrt::kernels::cpu {

// The type a kernel computes in for storage type S.
template <typename S>
struct AccType {
  using type = float;
};
template <>
struct AccType<double> {
  using type = double;
};
template <typename S>
using acc_t = typename AccType<S>::type;

// True for the 16-bit storage types, which are converted to fp32 before BLAS calls.
template <typename S>
constexpr bool kIs16Bit = std::is_same_v<S, bf16> || std::is_same_v<S, fp16>;

// Reads a storage value as A (float or double).
template <typename A, typename S>
inline A load(S v) {
  if constexpr (std::is_same_v<S, float> || std::is_same_v<S, double>) {
    return static_cast<A>(v);
  } else {
    return static_cast<A>(to_float(v));
  }
}

// Rounds an A value to storage type S (round to nearest even for 16-bit types).
template <typename S, typename A>
inline S store(A v) {
  if constexpr (std::is_same_v<S, float> || std::is_same_v<S, double>) {
    return static_cast<S>(v);
  } else if constexpr (std::is_same_v<S, bf16>) {
    return to_bf16(static_cast<float>(v));
  } else {
    return to_fp16(static_cast<float>(v));
  }
}

// dst[i] = src[i] as acc_t<S>, i < n (OpenMP-parallel).
template <typename S>
void convert_to_acc(acc_t<S>* dst, const S* src, std::int64_t n);
// dst[i] = round(src[i]) (OpenMP-parallel).
template <typename S>
void convert_from_acc(S* dst, const acc_t<S>* src, std::int64_t n);
// dst[i] = round(dst[i] + src[i]) (OpenMP-parallel): accumulation into a 16-bit array.
template <typename S>
void accumulate_from_acc(S* dst, const acc_t<S>* src, std::int64_t n);

}  // namespace zrt::kernels::cpu
