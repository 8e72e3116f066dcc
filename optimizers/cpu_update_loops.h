// The per-ISA element loops of the CPU optimizers, written once over an optimizer's element
// update U (cpu_adam_kernels.cc, cpu_lion_kernels.cc). Each vector loop performs U's operations on
// 8 or 16 lanes; the remainder of a range (< one vector) goes through the scalar loop, whose update
// is the optimizer's *_update_element() (adam_math.h, lion_math.h) and which the lanes reproduce
// bit for bit, so where a range starts or ends (the thread partition) never changes a result.
// Include only from the kernel files (built with -ffp-contract=off and -fno-math-errno, like
// cpu_vector_io.h).
//
// Writes: everything (kAll), or only the compute-dtype copy (kComputeCopyOnly: the parameter
// and states are read and updated in registers but not stored, so the same step run again with
// kAll gives the same copy and then the new state; optimizer offload's split step).
//
// Memory: the loops software-prefetch param, grad and every state array kPrefetch elements ahead
// (the hardware prefetchers alone leave about 10% of the bandwidth unused with four read streams
// and compute in between), and on long ranges write the compute-dtype copy with non-temporal
// stores (it is not read here, so a normal store would first read the line: 2 extra bytes per
// parameter).
//
// The loops run an optimizer's Math (AdamMath, LionMath: adam_math.h, lion_math.h) over its host
// Slice: Math::with_update() picks the element update U a slice gets, U::element() updates one
// element whose states are the slice's (SliceTraits<Slice>::kStates), and CpuLanes<U>, which
// the kernel file defines, does the same on vectors:
//   struct Lanes8, Lanes16: built from U's Scalars once per range (broadcasts), then
//   operator()(p, g, state) on __m256 / __m512 values; both members carry the ISA's target
//   attribute.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "optimizers/cpu_vector_io.h"
#include "optimizers/optimizer_slices.h"
#include "runtime/common/cpu_isa.h"
#include "runtime/engine/optimizer_interface.h"  // StepWrites

namespace zrt::detail {
namespace {  // each kernel file gets its own copies, like cpu_vector_io.h

template <typename U>
struct CpuLanes;

template <typename Slice, typename Math>
using RangeFn = void (*)(const Slice&, std::int64_t, std::int64_t, const typename Math::Scalars&);

// ---- scalar (portable code; GCC vectorizes it for baseline x86-64 where it can) ------------

struct ScalarLoop {
  template <typename Slice, typename U, DType G, OutKind O, StepWrites W>
  static void run(const Slice& sl, std::int64_t begin, std::int64_t end,
                  const typename U::Scalars& s) {
    float* const param = sl.param;
    const auto states = raw_states(sl);
    static_assert(kNumSliceStates<Slice> == U::kStates, "the slice's states are the update's");
    for (std::int64_t i = begin; i < end; ++i) {
      float p = param[i];
      float state[U::kStates];
      for (int k = 0; k < U::kStates; ++k) state[k] = states[k][i];
      U::element(p, load_grad<G>(sl.grad, i), state, s);
      if constexpr (W == StepWrites::kAll) {
        param[i] = p;
        for (int k = 0; k < U::kStates; ++k) states[k][i] = state[k];
      }
      store_out<O>(sl.param_out, i, p);
    }
  }
};

// ---- vector loops --------------------------------------------------------------------------

// Vector loop over [begin, end - (end - begin) % 8) from begin; returns where it stopped.
struct Avx2Loop {
  static constexpr std::int64_t kLanes = 8;
  template <typename Slice, typename U, DType G, OutKind O, bool kStream, StepWrites W>
  ZRT_TARGET_AVX2 static std::int64_t loop(const Slice& sl, std::int64_t begin, std::int64_t end,
                                           const typename U::Scalars& s) {
    float* const param = sl.param;
    const auto states = raw_states(sl);
    const auto* const grad = static_cast<const std::uint8_t*>(sl.grad);
    constexpr std::int64_t kGradBytes = G == DType::kFloat32 ? 4 : 2;
    const typename CpuLanes<U>::Lanes8 update(s);
    std::int64_t i = begin;
    for (; i + kLanes <= end; i += kLanes) {
      prefetch(param, i + kPrefetch);
      for (float* state : states) prefetch(state, i + kPrefetch);
      prefetch(grad, (i + kPrefetch) * kGradBytes);
      __m256 p = _mm256_loadu_ps(param + i);
      __m256 state[U::kStates];
      for (int k = 0; k < U::kStates; ++k) state[k] = _mm256_loadu_ps(states[k] + i);
      update(p, load_grad8<G>(sl.grad, i), state);
      if constexpr (W == StepWrites::kAll) {
        _mm256_storeu_ps(param + i, p);
        for (int k = 0; k < U::kStates; ++k) _mm256_storeu_ps(states[k] + i, state[k]);
      }
      store_out8<O, kStream>(sl.param_out, i, p);
    }
    return i;
  }
};

// The same on 16 lanes.
struct Avx512Loop {
  static constexpr std::int64_t kLanes = 16;
  template <typename Slice, typename U, DType G, OutKind O, bool kStream, StepWrites W>
  ZRT_TARGET_AVX512 static std::int64_t loop(const Slice& sl, std::int64_t begin, std::int64_t end,
                                             const typename U::Scalars& s) {
    float* const param = sl.param;
    const auto states = raw_states(sl);
    const auto* const grad = static_cast<const std::uint8_t*>(sl.grad);
    constexpr std::int64_t kGradBytes = G == DType::kFloat32 ? 4 : 2;
    const typename CpuLanes<U>::Lanes16 update(s);
    std::int64_t i = begin;
    for (; i + kLanes <= end; i += kLanes) {
      prefetch(param, i + kPrefetch);
      for (float* state : states) prefetch(state, i + kPrefetch);
      prefetch(grad, (i + kPrefetch) * kGradBytes);
      __m512 p = _mm512_loadu_ps(param + i);
      __m512 state[U::kStates];
      for (int k = 0; k < U::kStates; ++k) state[k] = _mm512_loadu_ps(states[k] + i);
      update(p, load_grad16<G>(sl.grad, i), state);
      if constexpr (W == StepWrites::kAll) {
        _mm512_storeu_ps(param + i, p);
        for (int k = 0; k < U::kStates; ++k) _mm512_storeu_ps(states[k] + i, state[k]);
      }
      store_out16<O, kStream>(sl.param_out, i, p);
    }
    return i;
  }
};

// A range with ISA's vector loop: the scalar loop up to where the compute-dtype copy can be
// streamed (long ranges only), the vector loop, the scalar loop for the tail.
template <typename Isa>
struct VectorLoop {
  template <typename Slice, typename U, DType G, OutKind O, StepWrites W>
  static void run(const Slice& sl, std::int64_t begin, std::int64_t end,
                  const typename U::Scalars& s) {
    constexpr std::size_t kOutBytes = O == OutKind::kF32 ? 4 : 2;
    const std::int64_t aligned =
        O == OutKind::kNone
            ? -1
            : stream_start(sl.param_out, kOutBytes, Isa::kLanes * kOutBytes, begin, end);
    std::int64_t i;
    if (aligned >= 0) {
      ScalarLoop::run<Slice, U, G, O, W>(sl, begin, aligned, s);
      i = Isa::template loop<Slice, U, G, O, true, W>(sl, aligned, end, s);
      _mm_sfence();  // order the streamed lines before whoever reads the copy next
    } else {
      i = Isa::template loop<Slice, U, G, O, false, W>(sl, begin, end, s);
    }
    ScalarLoop::run<Slice, U, G, O, W>(sl, i, end, s);
  }
};

// ---- dispatch on (grad dtype, output, weight-decay form) -------------------------------------

template <typename Loop, typename Math, typename Slice, StepWrites W, DType G>
void dispatch_out(const Slice& sl, std::int64_t b, std::int64_t e,
                  const typename Math::Scalars& s) {
  auto run = [&](auto out) {
    Math::with_update(s, sl.weight_decay, [&](auto update) {
      Loop::template run<Slice, decltype(update), G, decltype(out)::value, W>(sl, b, e, s);
    });
  };
  switch (out_kind(sl)) {
    case OutKind::kNone:
      // A compute-copy-only step of a slice without a copy writes nothing (prepare_step's
      // callers do not ask for it).
      if constexpr (W == StepWrites::kComputeCopyOnly) return;
      return run(std::integral_constant<OutKind, OutKind::kNone>{});
    case OutKind::kF32:
      return run(std::integral_constant<OutKind, OutKind::kF32>{});
    case OutKind::kBF16:
      return run(std::integral_constant<OutKind, OutKind::kBF16>{});
    case OutKind::kF16:
      return run(std::integral_constant<OutKind, OutKind::kF16>{});
  }
}

template <typename Loop, typename Math, typename Slice, StepWrites W>
void dispatch(const Slice& sl, std::int64_t b, std::int64_t e, const typename Math::Scalars& s) {
  switch (sl.grad_dtype) {
    case DType::kBFloat16:
      return dispatch_out<Loop, Math, Slice, W, DType::kBFloat16>(sl, b, e, s);
    case DType::kFloat16:
      return dispatch_out<Loop, Math, Slice, W, DType::kFloat16>(sl, b, e, s);
    default:
      return dispatch_out<Loop, Math, Slice, W, DType::kFloat32>(sl, b, e, s);
  }
}

template <typename Loop, typename Math, typename Slice>
RangeFn<Slice, Math> dispatch_for(StepWrites writes) {
  return writes == StepWrites::kComputeCopyOnly
             ? dispatch<Loop, Math, Slice, StepWrites::kComputeCopyOnly>
             : dispatch<Loop, Math, Slice, StepWrites::kAll>;
}

// The range kernel of optimizer Math over Slice for `isa` (the scalar one for anything but AVX2
// and AVX-512) that writes `writes`.
template <typename Math, typename Slice>
RangeFn<Slice, Math> range_kernel_for(CpuIsa isa, StepWrites writes) {
  switch (isa) {
    case CpuIsa::kAvx512:
      return dispatch_for<VectorLoop<Avx512Loop>, Math, Slice>(writes);
    case CpuIsa::kAvx2:
      return dispatch_for<VectorLoop<Avx2Loop>, Math, Slice>(writes);
    default:
      return dispatch_for<ScalarLoop, Math, Slice>(writes);
  }
}

}  // namespace
}  // namespace zrt::detail
