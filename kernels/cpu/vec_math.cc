#include "kernels/cpu/vec_math.h"

#include "runtime/common/simd.h"

namespace zrt::kernels::cpu {

namespace {
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluCubic = 0.044715f;
}  // namespace

ZRT_SIMD_BODY void gelu_forward_span_body(float* out, const float* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float u = kGeluScale * (v + kGeluCubic * v * v * v);
    out[i] = 0.5f * v * (1.0f + tanh_approx(u));
  }
}
ZRT_SIMD_DISPATCH(void, gelu_forward_span, (float* out, const float* x, std::int64_t n),
                  (out, x, n), gelu_forward_span_body)

ZRT_SIMD_BODY void gelu_backward_span_body(float* dinp, const float* x, const float* dout,
                                           std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float u = kGeluScale * (v + kGeluCubic * v * v * v);
    const float th = tanh_approx(u);
    const float local = 0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * kGeluScale *
                                                 (1.0f + 3.0f * kGeluCubic * v * v);
    dinp[i] += local * dout[i];
  }
}
ZRT_SIMD_DISPATCH(void, gelu_backward_span,
                  (float* dinp, const float* x, const float* dout, std::int64_t n),
                  (dinp, x, dout, n), gelu_backward_span_body)

ZRT_SIMD_BODY float span_max_body(const float* x, std::int64_t n) {
  float m = x[0];
#pragma omp simd reduction(max : m)
  for (std::int64_t i = 1; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}
ZRT_SIMD_DISPATCH(float, span_max, (const float* x, std::int64_t n), (x, n), span_max_body)

ZRT_SIMD_BODY float span_sum_exp_body(const float* x, std::int64_t n, float shift) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (std::int64_t i = 0; i < n; ++i) s += exp_approx(x[i] - shift);
  return s;
}
ZRT_SIMD_DISPATCH(float, span_sum_exp, (const float* x, std::int64_t n, float shift), (x, n, shift),
                  span_sum_exp_body)

ZRT_SIMD_BODY void span_exp_scale_body(float* x, std::int64_t n, float shift, float scale) {
  for (std::int64_t i = 0; i < n; ++i) x[i] = exp_approx(x[i] - shift) * scale;
}
ZRT_SIMD_DISPATCH(void, span_exp_scale, (float* x, std::int64_t n, float shift, float scale),
                  (x, n, shift, scale), span_exp_scale_body)

ZRT_SIMD_BODY void span_exp_scale_to_body(float* out, const float* x, std::int64_t n, float shift,
                                          float scale) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = exp_approx(x[i] - shift) * scale;
}
ZRT_SIMD_DISPATCH(void, span_exp_scale_to,
                  (float* out, const float* x, std::int64_t n, float shift, float scale),
                  (out, x, n, shift, scale), span_exp_scale_to_body)

ZRT_SIMD_BODY float span_sum_body(const float* x, std::int64_t n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (std::int64_t i = 0; i < n; ++i) s += x[i];
  return s;
}
ZRT_SIMD_DISPATCH(float, span_sum, (const float* x, std::int64_t n), (x, n), span_sum_body)

ZRT_SIMD_BODY void span_scale_body(float* x, std::int64_t n, float scale) {
  for (std::int64_t i = 0; i < n; ++i) x[i] *= scale;
}
ZRT_SIMD_DISPATCH(void, span_scale, (float* x, std::int64_t n, float scale), (x, n, scale),
                  span_scale_body)

ZRT_SIMD_BODY float span_dot_body(const float* a, const float* b, std::int64_t n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (std::int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}
ZRT_SIMD_DISPATCH(float, span_dot, (const float* a, const float* b, std::int64_t n), (a, b, n),
                  span_dot_body)

ZRT_SIMD_BODY void span_softmax_grad_body(float* d, const float* a, std::int64_t n, float c) {
  for (std::int64_t i = 0; i < n; ++i) d[i] = a[i] * (d[i] - c);
}
ZRT_SIMD_DISPATCH(void, span_softmax_grad, (float* d, const float* a, std::int64_t n, float c),
                  (d, a, n, c), span_softmax_grad_body)

}  // namespace zrt::kernels::cpu
