// Vectorizable fp32 math for the CPU kernels' hot loops: exp and tanh as branch-free
// polynomials (so the loops vectorize; libm's expf/tanhf are scalar calls), and span helpers
// compiled for AVX-512, AVX2 and baseline x86-64 (ZRT_SIMD_DISPATCH). Deterministic for a given
// path; reductions use OpenMP SIMD reductions, so their order depends on the vector width of the
// path active_cpu_isa() picks (ZRT_CPU_ISA can force one), never on the thread count.
#pragma once

#include <cstdint>
#include <cstring>

namespace zrt::kernels::cpu {

// exp(x) in fp32 (Cephes' expf: range reduction by ln 2, degree-6 polynomial), within 2 ulp of
// the exact value for x in [-87, 88]; clamps below (to about 1.2e-38) and above (to 2^128).
inline float exp_approx(float x) {
  x = x < -87.3365f ? -87.3365f : (x > 88.7228f ? 88.7228f : x);
  const float t = x * 1.44269504088896341f;
  const int n = static_cast<int>(t + (t >= 0.0f ? 0.5f : -0.5f));
  const float fn = static_cast<float>(n);
  float r = x - fn * 0.693359375f;
  r = r - fn * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * (r * r) + r + 1.0f;
  // y * 2^n, in two steps so n = 128 (x near 88.72) does not overflow the exponent field.
  const int n1 = n >> 1;
  const int n2 = n - n1;
  const std::uint32_t b1 = static_cast<std::uint32_t>(n1 + 127) << 23;
  const std::uint32_t b2 = static_cast<std::uint32_t>(n2 + 127) << 23;
  float s1, s2;
  std::memcpy(&s1, &b1, 4);
  std::memcpy(&s2, &b2, 4);
  return y * s1 * s2;
}

// tanh(x) = sign(x) (1 - e) / (1 + e), e = exp(-2|x|): absolute error below 2e-7 (what GELU
// needs, since it adds tanh to 1); relative accuracy is lower for |x| < 1e-3.
inline float tanh_approx(float x) {
  const float ax = x < 0.0f ? -x : x;
  const float e = exp_approx(-2.0f * ax);
  const float t = (1.0f - e) / (1.0f + e);
  return x < 0.0f ? -t : t;
}

// GELU (tanh form) over a span: out = gelu(x); and dinp += gelu'(x) * dout.
void gelu_forward_span(float* out, const float* x, std::int64_t n);
void gelu_backward_span(float* dinp, const float* x, const float* dout, std::int64_t n);
// max of x[0..n), n >= 1.
float span_max(const float* x, std::int64_t n);
// sum of exp(x[i] - shift).
float span_sum_exp(const float* x, std::int64_t n, float shift);
// x[i] = exp(x[i] - shift) * scale.
void span_exp_scale(float* x, std::int64_t n, float shift, float scale);
// out[i] = exp(x[i] - shift) * scale (out may equal x).
void span_exp_scale_to(float* out, const float* x, std::int64_t n, float shift, float scale);
// sum of x[i].
float span_sum(const float* x, std::int64_t n);
// x[i] *= scale.
void span_scale(float* x, std::int64_t n, float scale);
// sum of a[i] * b[i].
float span_dot(const float* a, const float* b, std::int64_t n);
// d[i] = a[i] * (d[i] - c).
void span_softmax_grad(float* d, const float* a, std::int64_t n, float c);

}  // namespace zrt::kernels::cpu
