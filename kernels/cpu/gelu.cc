#include "kernels/cpu/gelu.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/cpu/vec_math.h"

namespace zrt::kernels::cpu {

namespace {
template <typename A>
constexpr A kGeluScale = static_cast<A>(0.7978845608028654);  // sqrt(2/pi)
template <typename A>
constexpr A kGeluCubic = static_cast<A>(0.044715);

constexpr std::int64_t kChunk = 2048;

// fp32 and 16-bit storage: chunks through the vectorized span functions (16-bit converted to
// fp32 in a per-chunk buffer).
template <typename S>
void gelu_forward_fp32(S* out, const S* inp, std::int64_t n) {
  const std::int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
  for (std::int64_t k = 0; k < chunks; ++k) {
    const std::int64_t i0 = k * kChunk;
    const std::int64_t len = std::min(kChunk, n - i0);
    if constexpr (std::is_same_v<S, float>) {
      gelu_forward_span(out + i0, inp + i0, len);
    } else {
      float x[kChunk], y[kChunk];
      for (std::int64_t i = 0; i < len; ++i) x[i] = load<float>(inp[i0 + i]);
      gelu_forward_span(y, x, len);
      for (std::int64_t i = 0; i < len; ++i) out[i0 + i] = store<S>(y[i]);
    }
  }
}

template <typename S>
void gelu_backward_fp32(S* dinp, const S* inp, const S* dout, std::int64_t n) {
  const std::int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
  for (std::int64_t k = 0; k < chunks; ++k) {
    const std::int64_t i0 = k * kChunk;
    const std::int64_t len = std::min(kChunk, n - i0);
    if constexpr (std::is_same_v<S, float>) {
      gelu_backward_span(dinp + i0, inp + i0, dout + i0, len);
    } else {
      float x[kChunk], dy[kChunk], dx[kChunk];
      for (std::int64_t i = 0; i < len; ++i) {
        x[i] = load<float>(inp[i0 + i]);
        dy[i] = load<float>(dout[i0 + i]);
        dx[i] = load<float>(dinp[i0 + i]);
      }
      gelu_backward_span(dx, x, dy, len);
      for (std::int64_t i = 0; i < len; ++i) dinp[i0 + i] = store<S>(dx[i]);
    }
  }
}
}  // namespace

template <typename S>
void gelu_forward(S* out, const S* inp, std::int64_t n) {
  using A = acc_t<S>;
  if constexpr (std::is_same_v<A, float>) {
    gelu_forward_fp32(out, inp, n);
    return;
  }
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < n; ++i) {
    const A x = load<A>(inp[i]);
    const A u = kGeluScale<A> * (x + kGeluCubic<A> * x * x * x);
    out[i] = store<S>(A(0.5) * x * (A(1) + std::tanh(u)));
  }
}

template <typename S>
void gelu_backward(S* dinp, const S* inp, const S* dout, std::int64_t n) {
  using A = acc_t<S>;
  if constexpr (std::is_same_v<A, float>) {
    gelu_backward_fp32(dinp, inp, dout, n);
    return;
  }
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < n; ++i) {
    const A x = load<A>(inp[i]);
    const A u = kGeluScale<A> * (x + kGeluCubic<A> * x * x * x);
    const A th = std::tanh(u);
    const A local = A(0.5) * (A(1) + th) + A(0.5) * x * (A(1) - th * th) * kGeluScale<A> *
                                               (A(1) + A(3) * kGeluCubic<A> * x * x);
    dinp[i] = store<S>(load<A>(dinp[i]) + local * load<A>(dout[i]));
  }
}

#define ZRT_INSTANTIATE(S)                                   \
  template void gelu_forward<S>(S*, const S*, std::int64_t); \
  template void gelu_backward<S>(S*, const S*, const S*, std::int64_t);
ZRT_INSTANTIATE(float)
ZRT_INSTANTIATE(double)
ZRT_INSTANTIATE(bf16)
ZRT_INSTANTIATE(fp16)
#undef ZRT_INSTANTIATE

}  // namespace zrt::kernels::cpu
