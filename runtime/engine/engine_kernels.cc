#include "runtime/engine/engine_kernels.h"

#include <algorithm>
#include <cstring>

#include "runtime/common/error.h"
#include "runtime/common/simd.h"
#include "runtime/device/backend_dispatch.h"
#include "runtime/device/cpu_stream.h"
#include "runtime/device/device_access.h"
#include "runtime/device/host_memory.h"

namespace zrt::engine_kernels {

#if ZRT_HAVE_CUDA
namespace cuda {
void convert(Stream& s, const void* src, DType st, void* dst, DType dt, std::int64_t n);
void accumulate(Stream& s, const void* src, DType st, void* dst, DType dt, std::int64_t n);
void scale(Stream& s, void* x, DType t, std::int64_t n, float factor);
void add_sum_squares(Stream& s, const void* x, DType t, std::int64_t n, float* acc);
void store_to_pinned_host(Stream& s, const float* src, float* dst, std::int64_t n);
void decide_step(Stream& s, const float* norm_squared, const StepDecisionInputs& inputs,
                 StepDecision* out);
}  // namespace cuda
#endif

namespace cpu {

namespace {
inline float load(const void* p, DType t, std::int64_t i) {
  switch (t) {
    case DType::kFloat32:
      return static_cast<const float*>(p)[i];
    case DType::kBFloat16:
      return to_float(static_cast<const bf16*>(p)[i]);
    case DType::kFloat16:
      return to_float(static_cast<const fp16*>(p)[i]);
    default:
      return 0.0f;
  }
}
inline void store(void* p, DType t, std::int64_t i, float v) {
  switch (t) {
    case DType::kFloat32:
      static_cast<float*>(p)[i] = v;
      break;
    case DType::kBFloat16:
      static_cast<bf16*>(p)[i] = to_bf16(v);
      break;
    case DType::kFloat16:
      static_cast<fp16*>(p)[i] = to_fp16(v);
      break;
    default:
      break;
  }
}
void check_float(DType t, const char* what) {
  ZRT_CHECK(is_floating(t), "{}: {} is not a floating-point type", what, dtype_name(t));
}

ZRT_SIMD_BODY void add_f32_body(const float* src, float* dst, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) dst[i] += src[i];
}
ZRT_SIMD_DISPATCH(void, add_f32, (const float* src, float* dst, std::int64_t n), (src, dst, n),
                  add_f32_body)
// to_bf16() (dtype.h) written as a loop the compiler vectorizes: the same bits, NaN included.
ZRT_SIMD_BODY void f32_to_bf16_body(const float* src, bf16* dst, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    std::uint32_t u;
    std::memcpy(&u, src + i, sizeof u);
    const std::uint32_t nearest = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const std::uint32_t quiet_nan = (u >> 16) | 0x0040u;
    dst[i].bits = static_cast<std::uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : nearest);
  }
}
ZRT_SIMD_DISPATCH(void, f32_to_bf16, (const float* src, bf16* dst, std::int64_t n), (src, dst, n),
                  f32_to_bf16_body)
ZRT_SIMD_BODY void scale_f32_body(float* x, std::int64_t n, float factor) {
  for (std::int64_t i = 0; i < n; ++i) x[i] *= factor;
}
ZRT_SIMD_DISPATCH(void, scale_f32, (float* x, std::int64_t n, float factor), (x, n, factor),
                  scale_f32_body)
}  // namespace

void convert(const void* src, DType st, void* dst, DType dt, std::int64_t n) {
  check_float(st, "convert");
  check_float(dt, "convert");
  if (st == dt) {
    if (src != dst) std::memmove(dst, src, static_cast<std::size_t>(n) * dtype_size(st));
    return;
  }
  if (st == DType::kFloat32 && dt == DType::kBFloat16) {
    f32_to_bf16(static_cast<const float*>(src), static_cast<bf16*>(dst), n);
    return;
  }
  for (std::int64_t i = 0; i < n; ++i) store(dst, dt, i, load(src, st, i));
}

void convert_on_host_threads(const void* src, DType st, void* dst, DType dt, std::int64_t n) {
  check_float(st, "convert");
  check_float(dt, "convert");
  // Pieces of 256K values, a contiguous run of them a thread (static schedule).
  constexpr std::int64_t kPiece = std::int64_t{1} << 18;
  const std::size_t in_bytes = dtype_size(st);
  const std::size_t out_bytes = dtype_size(dt);
  const std::int64_t pieces = (n + kPiece - 1) / kPiece;
#pragma omp parallel for schedule(static) \
    num_threads(host_pass_threads(static_cast <std::size_t>(n) * in_bytes))
  for (std::int64_t p = 0; p < pieces; ++p) {
    const std::int64_t begin = p * kPiece;
    convert(static_cast<const std::byte*>(src) + static_cast<std::size_t>(begin) * in_bytes, st,
            static_cast<std::byte*>(dst) + static_cast<std::size_t>(begin) * out_bytes, dt,
            std::min(kPiece, n - begin));
  }
}

void accumulate(const void* src, DType st, void* dst, DType dt, std::int64_t n) {
  check_float(st, "accumulate");
  check_float(dt, "accumulate");
  if (st == DType::kFloat32 && dt == DType::kFloat32) {
    add_f32(static_cast<const float*>(src), static_cast<float*>(dst), n);
    return;
  }
  for (std::int64_t i = 0; i < n; ++i) store(dst, dt, i, load(dst, dt, i) + load(src, st, i));
}

void scale(void* x, DType t, std::int64_t n, float factor) {
  check_float(t, "scale");
  if (t == DType::kFloat32) {
    scale_f32(static_cast<float*>(x), n, factor);
    return;
  }
  for (std::int64_t i = 0; i < n; ++i) store(x, t, i, load(x, t, i) * factor);
}

double sum_squares(const void* x, DType t, std::int64_t n) {
  check_float(t, "sum_squares");
  double sum = 0.0;
  for (std::int64_t i = 0; i < n; ++i) {
    const double v = load(x, t, i);
    sum += v * v;
  }
  return sum;
}

}  // namespace cpu

void convert(Device& device, Stream& stream, DevicePtr<const std::byte> src, DType src_type,
             DevicePtr<std::byte> dst, DType dst_type, std::int64_t n) {
  const void* s = device_access::raw(src);
  void* d = device_access::raw(dst);
  if (runs_on_cpu(device)) {
    as_cpu_stream(stream, "convert").enqueue([=] { cpu::convert(s, src_type, d, dst_type, n); });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda::convert(stream, s, src_type, d, dst_type, n);
#else
  cuda_backend_missing("engine_kernels::convert");
#endif
}

void accumulate(Device& device, Stream& stream, DevicePtr<const std::byte> src, DType src_type,
                DevicePtr<std::byte> dst, DType dst_type, std::int64_t n) {
  const void* s = device_access::raw(src);
  void* d = device_access::raw(dst);
  if (runs_on_cpu(device)) {
    as_cpu_stream(stream, "accumulate").enqueue([=] {
      cpu::accumulate(s, src_type, d, dst_type, n);
    });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda::accumulate(stream, s, src_type, d, dst_type, n);
#else
  cuda_backend_missing("engine_kernels::accumulate");
#endif
}

void scale(Device& device, Stream& stream, DevicePtr<std::byte> x, DType type, std::int64_t n,
           float factor) {
  void* p = device_access::raw(x);
  if (runs_on_cpu(device)) {
    as_cpu_stream(stream, "scale").enqueue([=] { cpu::scale(p, type, n, factor); });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda::scale(stream, p, type, n, factor);
#else
  cuda_backend_missing("engine_kernels::scale");
#endif
}

void add_sum_squares(Device& device, Stream& stream, DevicePtr<const std::byte> x, DType type,
                     std::int64_t n, DevicePtr<float> acc) {
  const void* p = device_access::raw(x);
  float* a = device_access::raw(acc);
  if (runs_on_cpu(device)) {
    as_cpu_stream(stream, "add_sum_squares").enqueue([=] {
      *a += static_cast<float>(cpu::sum_squares(p, type, n));
    });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda::add_sum_squares(stream, p, type, n, a);
#else
  cuda_backend_missing("engine_kernels::add_sum_squares");
#endif
}

void store_to_pinned_host(Device& device, Stream& stream, DevicePtr<const float> src, float* dst,
                          std::int64_t n) {
  ZRT_CHECK(n >= 0 && (n == 0 || dst != nullptr), "store_to_pinned_host: {} floats to {}", n,
            static_cast<const void*>(dst));
  const float* p = device_access::raw(src);
  if (runs_on_cpu(device)) {
    as_cpu_stream(stream, "store_to_pinned_host").enqueue([=] {
      std::memcpy(dst, p, static_cast<std::size_t>(n) * sizeof(float));
    });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda::store_to_pinned_host(stream, p, dst, n);
#else
  cuda_backend_missing("engine_kernels::store_to_pinned_host");
#endif
}

void decide_step(Device& device, Stream& stream, DevicePtr<const float> norm_squared,
                 const StepDecisionInputs& inputs, DevicePtr<StepDecision> out) {
  const float* n = device_access::raw(norm_squared);
  StepDecision* d = device_access::raw(out);
  if (runs_on_cpu(device)) {
    as_cpu_stream(stream, "decide_step").enqueue([=] { *d = zrt::decide_step(*n, inputs); });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda::decide_step(stream, n, inputs, d);
#else
  cuda_backend_missing("engine_kernels::decide_step");
#endif
}

}  // namespace zrt::engine_kernels
