#include "kernels/ops.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <utility>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/crossentropy.h"
#include "kernels/cpu/documents.h"
#include "kernels/cpu/encoder.h"
#include "kernels/cpu/gelu.h"
#include "kernels/cpu/gqa_attention.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/residual.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/swiglu.h"
#include "kernels/cuda/attention_plan.h"
#include "kernels/op_dispatch.h"
#include "runtime/common/error.h"
#include "runtime/device/backend_dispatch.h"
#include "runtime/device/cpu_stream.h"
#include "runtime/device/device_access.h"

#if ZRT_HAVE_CUDA
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/crossentropy.cuh"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cudnn_attention.h"
#include "kernels/cuda/encoder.cuh"
#include "kernels/cuda/gelu.cuh"
#include "kernels/cuda/gqa_attention.cuh"
#include "kernels/cuda/layernorm.cuh"
#include "kernels/cuda/linear.cuh"
#include "kernels/cuda/matmul.cuh"
#include "kernels/cuda/matmul_gelu.cuh"
#include "kernels/cuda/residual.cuh"
#include "kernels/cuda/rmsnorm.cuh"
#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/swiglu.cuh"
#endif

namespace zrt::kernels {

using dispatch::cpu_workspace;
#if ZRT_HAVE_CUDA
using dispatch::launch;
#endif
using dispatch::on_cpu;
using dispatch::ptr;
using dispatch::raw;
using dispatch::run_cpu;
using dispatch::with_storage;
using dispatch::with_storage_grad;

void check_dtypes(DType dtype, DType grad_dtype) {
  const bool ok = (dtype == DType::kFloat32 && grad_dtype == DType::kFloat32) ||
                  (is_float16(dtype) && (grad_dtype == dtype || grad_dtype == DType::kFloat32));
  if (!ok) {
    ZRT_THROW(InvalidArgument,
              "kernels: unsupported dtypes (activations {}, gradients {}); supported: fp32/fp32, "
              "bf16/bf16|fp32, fp16/fp16|fp32",
              dtype_name(dtype), dtype_name(grad_dtype));
  }
}

void encoder_forward(KernelContext& ctx, DType dtype, Bytes out, ConstTokens tokens, ConstBytes wte,
                     ConstBytes wpe, int B, int T, int C, int V, ConstTokens positions,
                     int position_rows) {
  if (on_cpu(ctx)) {
    with_storage(dtype, [&](auto s) {
      using S = decltype(s);
      run_cpu(ctx, "encoder_forward",
              [o = ptr<S>(out), tok = raw(tokens), w = ptr<S>(wte), p = ptr<S>(wpe), B, T, C, V,
               pos = raw(positions), position_rows] {
                cpu::encoder_forward<S>(o, tok, w, p, B, T, C, V, pos, position_rows);
              });
    });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda::encoder_forward(launch(ctx), dtype, raw(out), raw(tokens), raw(wte), raw(wpe), B, T, C, V,
                        raw(positions));
#else
  cuda_backend_missing("kernels::encoder_forward");
#endif
}

void encoder_backward(KernelContext& ctx, DType dtype, DType grad_dtype, Bytes dwte, Bytes dwpe,
                      ConstBytes dout, ConstTokens tokens, int B, int T, int C, int V,
                      ConstTokens positions, int position_rows) {
  if (on_cpu(ctx)) {
    with_storage_grad(dtype, grad_dtype, [&](auto s, auto g) {
      using S = decltype(s);
      using G = decltype(g);
      run_cpu(ctx, "encoder_backward",
              [dw = ptr<G>(dwte), dp = ptr<G>(dwpe), d = ptr<S>(dout), tok = raw(tokens), B, T, C,
               V, pos = raw(positions), position_rows] {
                cpu::encoder_backward<S, G>(dw, dp, d, tok, B, T, C, V, pos, position_rows);
              });
    });
    return;
  }
#if ZRT_HAVE_CUDA
  check_dtypes(dtype, grad_dtype);
  const bool by_position = positions && dwpe;
  cuda::encoder_backward(launch(ctx, cuda::encoder_backward_workspace(B, T, by_position)), dtype,
                         grad_dtype, raw(dwte), raw(dwpe), raw(dout), raw(tokens), B, T, C, V,
                         raw(positions), position_rows);
#else
  cuda_backend_missing("kernels::encoder_backward");
#endif
}

void layernorm_forward(KernelContext& ctx, DType dtype, Bytes out, Floats mean, Floats rstd,
                       ConstBytes inp, ConstBytes weight, ConstBytes bias, int N, int C) {
  if (on_cpu(ctx)) {
    with_storage(dtype, [&](auto s) {
      using S = decltype(s);
      run_cpu(ctx, "layernorm_forward",
              [o = ptr<S>(out), m = raw(mean), r = raw(rstd), x = ptr<S>(inp), w = ptr<S>(weight),
               b = ptr<S>(bias), N, C] { cpu::layernorm_forward<S>(o, m, r, x, w, b, N, C); });
    });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda::layernorm_forward(launch(ctx), dtype, raw(out), raw(mean), raw(rstd), raw(inp), raw(weight),
                          raw(bias), N, C);
#else
  cuda_backend_missing("kernels::layernorm_forward");
#endif
}

void residual_layernorm_forward(KernelContext& ctx, DType dtype, Bytes res, Bytes out, Floats mean,
                                Floats rstd, ConstBytes a, ConstBytes b, ConstBytes weight,
                                ConstBytes bias, int N, int C) {
  if (on_cpu(ctx)) {
    residual_forward(ctx, dtype, res, a, b, std::int64_t{N} * C);
    layernorm_forward(ctx, dtype, out, mean, rstd, res, weight, bias, N, C);
    return;
  }
#if ZRT_HAVE_CUDA
  cuda::residual_layernorm_forward(launch(ctx), dtype, raw(res), raw(out), raw(mean), raw(rstd),
                                   raw(a), raw(b), raw(weight), raw(bias), N, C);
#else
  cuda_backend_missing("kernels::residual_layernorm_forward");
#endif
}

void layernorm_backward(KernelContext& ctx, DType dtype, DType grad_dtype, Bytes dinp,
                        Bytes dweight, Bytes dbias, ConstBytes dout, ConstBytes inp,
                        ConstBytes weight, ConstFloats mean, ConstFloats rstd, int N, int C) {
  if (on_cpu(ctx)) {
    with_storage_grad(dtype, grad_dtype, [&](auto s, auto g) {
      using S = decltype(s);
      using G = decltype(g);
      run_cpu(ctx, "layernorm_backward",
              [dx = ptr<S>(dinp), dw = ptr<G>(dweight), db = ptr<G>(dbias), dy = ptr<S>(dout),
               x = ptr<S>(inp), w = ptr<S>(weight), m = raw(mean), r = raw(rstd), N,
               C] { cpu::layernorm_backward<S, G>(dx, dw, db, dy, x, w, m, r, N, C); });
    });
    return;
  }
#if ZRT_HAVE_CUDA
  check_dtypes(dtype, grad_dtype);
  cuda::layernorm_backward(launch(ctx, cuda::layernorm_backward_workspace(N, C)), dtype, grad_dtype,
                           raw(dinp), raw(dweight), raw(dbias), raw(dout), raw(inp), raw(weight),
                           raw(mean), raw(rstd), N, C);
#else
  cuda_backend_missing("kernels::layernorm_backward");
#endif
}

void matmul_forward(KernelContext& ctx, DType dtype, Bytes out, ConstBytes inp, ConstBytes weight,
                    ConstBytes bias, int N, int C, int OC) {
  if (on_cpu(ctx)) {
    with_storage(dtype, [&](auto s) {
      using S = decltype(s);
      auto* ws = cpu_workspace<cpu::acc_t<S>>(ctx, cpu::matmul_forward_workspace<S>(N, C, OC));
      run_cpu(ctx, "matmul_forward",
              [o = ptr<S>(out), x = ptr<S>(inp), w = ptr<S>(weight), b = ptr<S>(bias), N, C, OC,
               ws] { cpu::matmul_forward<S>(o, x, w, b, N, C, OC, ws); });
    });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda::matmul_forward(launch(ctx), dtype, raw(out), raw(inp), raw(weight), raw(bias), N, C, OC);
#else
  cuda_backend_missing("kernels::matmul_forward");
#endif
}

void matmul_backward(KernelContext& ctx, DType dtype, DType grad_dtype, Bytes dinp, Bytes dweight,
                     Bytes dbias, ConstBytes dout, ConstBytes inp, ConstBytes weight, int N, int C,
                     int OC, GradWrite dinp_write) {
  if (on_cpu(ctx)) {
    with_storage_grad(dtype, grad_dtype, [&](auto s, auto g) {
      using S = decltype(s);
      using G = decltype(g);
      auto* ws = cpu_workspace<cpu::acc_t<S>>(ctx, cpu::matmul_backward_workspace<S>(N, C, OC));
      run_cpu(ctx, "matmul_backward",
              [dx = ptr<S>(dinp), dw = ptr<G>(dweight), db = ptr<G>(dbias), dy = ptr<S>(dout),
               x = ptr<S>(inp), w = ptr<S>(weight), N, C, OC, ws, dinp_write] {
                cpu::matmul_backward<S, G>(dx, dw, db, dy, x, w, N, C, OC, ws, dinp_write);
              });
    });
    return;
  }
#if ZRT_HAVE_CUDA
  check_dtypes(dtype, grad_dtype);
  cuda::matmul_backward(launch(ctx, cuda::matmul_backward_workspace(N, OC)), dtype, grad_dtype,
                        raw(dinp), raw(dweight), raw(dbias), raw(dout), raw(inp), raw(weight), N, C,
                        OC, dinp_write);
#else
  cuda_backend_missing("kernels::matmul_backward");
#endif
}

void gelu_forward(KernelContext& ctx, DType dtype, Bytes out, ConstBytes inp, std::int64_t n) {
  if (on_cpu(ctx)) {
    with_storage(dtype, [&](auto s) {
      using S = decltype(s);
      run_cpu(ctx, "gelu_forward",
              [o = ptr<S>(out), x = ptr<S>(inp), n] { cpu::gelu_forward<S>(o, x, n); });
    });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda::gelu_forward(launch(ctx), dtype, raw(out), raw(inp), n);
#else
  cuda_backend_missing("kernels::gelu_forward");
#endif
}

void gelu_backward(KernelContext& ctx, DType dtype, Bytes dinp, ConstBytes inp, ConstBytes dout,
                   std::int64_t n) {
  if (on_cpu(ctx)) {
    with_storage(dtype, [&](auto s) {
      using S = decltype(s);
      run_cpu(ctx, "gelu_backward", [dx = ptr<S>(dinp), x = ptr<S>(inp), dy = ptr<S>(dout), n] {
        cpu::gelu_backward<S>(dx, x, dy, n);
      });
    });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda::gelu_backward(launch(ctx), dtype, raw(dinp), raw(inp), raw(dout), n);
#else
  cuda_backend_missing("kernels::gelu_backward");
#endif
}

void matmul_gelu_forward(KernelContext& ctx, DType dtype, Bytes out, Bytes pre, ConstBytes inp,
                         ConstBytes weight, ConstBytes bias, int N, int C, int OC) {
  if (on_cpu(ctx)) {
    matmul_forward(ctx, dtype, pre, inp, weight, bias, N, C, OC);
    gelu_forward(ctx, dtype, out, pre, std::int64_t{N} * OC);
    return;
  }
#if ZRT_HAVE_CUDA
  cuda::matmul_gelu_forward(launch(ctx), dtype, raw(out), raw(pre), raw(inp), raw(weight),
                            raw(bias), N, C, OC);
#else
  cuda_backend_missing("kernels::matmul_gelu_forward");
#endif
}

void matmul_dgelu_backward(KernelContext& ctx, DType dtype, DType grad_dtype, Bytes dpre,
                           Bytes scratch, Bytes dweight, Bytes dbias, ConstBytes dout,
                           ConstBytes act, ConstBytes weight, ConstBytes pre, int N, int C,
                           int OC) {
  if (on_cpu(ctx)) {
    matmul_backward(ctx, dtype, grad_dtype, scratch, dweight, dbias, dout, act, weight, N, C, OC,
                    GradWrite::kOverwrite);
    const std::int64_t n = std::int64_t{N} * C;
    ctx.device().fill_zero(dpre, static_cast<std::size_t>(n) * dtype_size(dtype), ctx.stream());
    gelu_backward(ctx, dtype, dpre, pre, scratch, n);
    return;
  }
#if ZRT_HAVE_CUDA
  check_dtypes(dtype, grad_dtype);
  cuda::matmul_dgelu_backward(launch(ctx, cuda::matmul_backward_workspace(N, OC)), dtype,
                              grad_dtype, raw(dpre), raw(scratch), raw(dweight), raw(dbias),
                              raw(dout), raw(act), raw(weight), raw(pre), N, C, OC);
#else
  cuda_backend_missing("kernels::matmul_dgelu_backward");
#endif
}

void residual_forward(KernelContext& ctx, DType dtype, Bytes out, ConstBytes a, ConstBytes b,
                      std::int64_t n) {
  if (on_cpu(ctx)) {
    with_storage(dtype, [&](auto s) {
      using S = decltype(s);
      run_cpu(ctx, "residual_forward", [o = ptr<S>(out), x = ptr<S>(a), y = ptr<S>(b), n] {
        cpu::residual_forward<S>(o, x, y, n);
      });
    });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda::residual_forward(launch(ctx), dtype, raw(out), raw(a), raw(b), n);
#else
  cuda_backend_missing("kernels::residual_forward");
#endif
}

void residual_backward(KernelContext& ctx, DType dtype, Bytes da, Bytes db, ConstBytes dout,
                       std::int64_t n) {
  if (on_cpu(ctx)) {
    with_storage(dtype, [&](auto s) {
      using S = decltype(s);
      run_cpu(ctx, "residual_backward", [x = ptr<S>(da), y = ptr<S>(db), d = ptr<S>(dout), n] {
        cpu::residual_backward<S>(x, y, d, n);
      });
    });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda::residual_backward(launch(ctx), dtype, raw(da), raw(db), raw(dout), n);
#else
  cuda_backend_missing("kernels::residual_backward");
#endif
}

namespace {
// How the attention backwards write their gradients (grad_write.h): cuDNN's writes them in place
// when they need not be added to (kIntoZeros, kOverwrite); zrt's kernels and the CPU twins
// accumulate, so kOverwrite zeroes first (on the op's stream, before the kernels).
#if ZRT_HAVE_CUDA
bool cudnn_writes_in_place(GradWrite write) {
  return write != GradWrite::kAccumulate;
}
#endif
// kIntoZeros is the caller's promise; the CPU backend holds it to it (a scan of the gradient,
// small beside the attention itself), so that every model test on the CPU checks the models'.
// All bytes zero: what Device::fill_zero leaves.
template <typename S>
void require_zeros(const S* p, std::int64_t n, const char* op, const char* name) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(p);
  const std::int64_t count = n * static_cast<std::int64_t>(sizeof(S));
  constexpr std::int64_t kBlock = 1 << 16;  // OR-reduced a block at a time (a vector loop)
  for (std::int64_t begin = 0; begin < count; begin += kBlock) {
    const std::int64_t end = std::min(count, begin + kBlock);
    unsigned char any = 0;
    for (std::int64_t i = begin; i < end; ++i) any |= bytes[i];
    if (any == 0) continue;
    std::int64_t i = begin;
    while (bytes[i] == 0) ++i;
    ZRT_THROW(Error,
              "{}: GradWrite::kIntoZeros, but {} is not zero (element {} of {}): the caller "
              "must zero the gradient before the backward, or pass kAccumulate",
              op, name, i / static_cast<std::int64_t>(sizeof(S)), n);
  }
}
}  // namespace

void attention_forward(KernelContext& ctx, DType dtype, Bytes out, Floats lse, ConstBytes qkv,
                       int B, int T, int C, int NH, ConstTokens doc_start, int window) {
  ZRT_CHECK(NH > 0 && C % NH == 0, "attention: C={} is not a multiple of NH={}", C, NH);
  window = cpu::effective_window(window, T);
  if (on_cpu(ctx)) {
    with_storage(dtype, [&](auto s) {
      using S = decltype(s);
      auto* ws =
          cpu_workspace<cpu::acc_t<S>>(ctx, cpu::attention_forward_workspace<S>(B, T, C, NH));
      run_cpu(ctx, "attention_forward",
              [o = ptr<S>(out), l = raw(lse), x = ptr<S>(qkv), B, T, C, NH, ws, ds = raw(doc_start),
               window] { cpu::attention_forward<S>(o, l, x, B, T, C, NH, ws, ds, window); });
    });
    return;
  }
#if ZRT_HAVE_CUDA
  const cuda::AttentionKernels kernels = cuda::attention_kernels(ctx.options());
  const std::int64_t own_workspace = cuda::attention_forward_workspace(dtype, B, T, C, NH, kernels);
  if (cuda::cudnn_attention_may_take(ctx.options(), dtype, raw(doc_start) != nullptr) &&
      cuda::cudnn_attention_forward(ctx,
                                    {dtype, B, T, NH, NH, C / NH, cuda::QkvLayout::kPacked,
                                     kernels.cudnn_deterministic, window, own_workspace},
                                    raw(out), raw(lse), raw(qkv), nullptr, nullptr)) {
    return;
  }
  cuda::attention_forward(launch(ctx, own_workspace), dtype, raw(out), raw(lse), raw(qkv), B, T, C,
                          NH, kernels, raw(doc_start), window);
#else
  cuda_backend_missing("kernels::attention_forward");
#endif
}

void attention_backward(KernelContext& ctx, DType dtype, Bytes dqkv, ConstBytes dout,
                        ConstBytes qkv, ConstBytes out, ConstFloats lse, int B, int T, int C,
                        int NH, ConstTokens doc_start, int window, GradWrite dqkv_write) {
  ZRT_CHECK(NH > 0 && C % NH == 0, "attention: C={} is not a multiple of NH={}", C, NH);
  window = cpu::effective_window(window, T);
  const std::int64_t dqkv_bytes =
      std::int64_t{B} * T * 3 * C * static_cast<std::int64_t>(dtype_size(dtype));
  if (on_cpu(ctx)) {
    with_storage(dtype, [&](auto s) {
      using S = decltype(s);
      auto* ws =
          cpu_workspace<cpu::acc_t<S>>(ctx, cpu::attention_backward_workspace<S>(B, T, C, NH));
      run_cpu(ctx, "attention_backward",
              [dx = ptr<S>(dqkv), dy = ptr<S>(dout), x = ptr<S>(qkv), y = ptr<S>(out), l = raw(lse),
               B, T, C, NH, ws, ds = raw(doc_start), window, dqkv_write, dqkv_bytes] {
                if (dqkv_write == GradWrite::kIntoZeros) {
                  require_zeros(dx, std::int64_t{B} * T * 3 * C, "attention_backward", "dqkv");
                } else if (dqkv_write == GradWrite::kOverwrite) {
                  std::memset(static_cast<void*>(dx), 0, static_cast<std::size_t>(dqkv_bytes));
                }
                cpu::attention_backward<S>(dx, dy, x, y, l, B, T, C, NH, ws, ds, window);
              });
    });
    return;
  }
#if ZRT_HAVE_CUDA
  const cuda::AttentionKernels kernels = cuda::attention_kernels(ctx.options());
  // cuDNN's forward, if it ran, left the same lse (natural log-sum-exp), so either backward
  // may follow it.
  const std::int64_t own_workspace =
      cuda::attention_backward_workspace(dtype, B, T, C, NH, kernels);
  if (cuda::cudnn_attention_may_take(ctx.options(), dtype, raw(doc_start) != nullptr) &&
      cuda::cudnn_attention_backward(ctx,
                                     {dtype, B, T, NH, NH, C / NH, cuda::QkvLayout::kPacked,
                                      kernels.cudnn_deterministic, window, own_workspace},
                                     raw(dqkv), nullptr, nullptr, raw(dout), raw(qkv), nullptr,
                                     nullptr, raw(out), raw(lse),
                                     cudnn_writes_in_place(dqkv_write))) {
    return;
  }
  if (dqkv_write == GradWrite::kOverwrite) {
    ctx.device().fill_zero(dqkv, static_cast<std::size_t>(dqkv_bytes), ctx.stream());
  }
  cuda::attention_backward(launch(ctx, own_workspace), dtype, raw(dqkv), raw(dout), raw(qkv),
                           raw(out), raw(lse), B, T, C, NH, kernels, raw(doc_start), window);
#else
  cuda_backend_missing("kernels::attention_backward");
#endif
}

namespace {
// The logits' row stride for an op: `row_stride`, or V when it is 0 (dense rows).
int logits_ld(int V, int row_stride) {
  ZRT_CHECK(row_stride == 0 || row_stride >= V,
            "logits row stride {} is below the vocabulary size {}", row_stride, V);
  return row_stride == 0 ? V : row_stride;
}
}  // namespace

int logits_row_stride(int V) {
  constexpr int kAlign = 128;
  return (V + kAlign - 1) / kAlign * kAlign;
}

void logits_forward(KernelContext& ctx, DType dtype, Bytes logits, ConstBytes inp, ConstBytes wte,
                    int N, int C, int V, int row_stride) {
  const int ldl = logits_ld(V, row_stride);
  if (on_cpu(ctx)) {
    with_storage(dtype, [&](auto s) {
      using S = decltype(s);
      auto* ws = cpu_workspace<cpu::acc_t<S>>(ctx, cpu::logits_forward_workspace<S>(N, C, V, ldl));
      run_cpu(ctx, "logits_forward",
              [o = ptr<S>(logits), x = ptr<S>(inp), w = ptr<S>(wte), N, C, V, ws, ldl] {
                cpu::logits_forward<S>(o, x, w, N, C, V, ws, ldl);
              });
    });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda::logits_forward(launch(ctx, cuda::logits_workspace(dtype, C, V, ldl)), dtype, raw(logits),
                       raw(inp), raw(wte), N, C, V, ldl);
#else
  cuda_backend_missing("kernels::logits_forward");
#endif
}

void logits_backward(KernelContext& ctx, DType dtype, DType grad_dtype, Bytes dinp, Bytes dwte,
                     ConstBytes dlogits, ConstBytes inp, ConstBytes wte, int N, int C, int V,
                     int row_stride) {
  const int ldl = logits_ld(V, row_stride);
  if (on_cpu(ctx)) {
    with_storage_grad(dtype, grad_dtype, [&](auto s, auto g) {
      using S = decltype(s);
      using G = decltype(g);
      auto* ws = cpu_workspace<cpu::acc_t<S>>(ctx, cpu::logits_backward_workspace<S>(N, C, V, ldl));
      run_cpu(ctx, "logits_backward",
              [dx = ptr<S>(dinp), dw = ptr<G>(dwte), dl = ptr<S>(dlogits), x = ptr<S>(inp),
               w = ptr<S>(wte), N, C, V, ws,
               ldl] { cpu::logits_backward<S, G>(dx, dw, dl, x, w, N, C, V, ws, ldl); });
    });
    return;
  }
#if ZRT_HAVE_CUDA
  check_dtypes(dtype, grad_dtype);
  cuda::logits_backward(launch(ctx), dtype, grad_dtype, raw(dinp), raw(dwte), raw(dlogits),
                        raw(inp), raw(wte), N, C, V, ldl);
#else
  cuda_backend_missing("kernels::logits_backward");
#endif
}

void crossentropy_forward(KernelContext& ctx, DType dtype, Floats losses, ConstBytes logits,
                          ConstTokens targets, int N, int V, int row_stride) {
  const int ldl = logits_ld(V, row_stride);
  if (on_cpu(ctx)) {
    with_storage(dtype, [&](auto s) {
      using S = decltype(s);
      run_cpu(ctx, "crossentropy_forward",
              [l = raw(losses), x = ptr<S>(logits), t = raw(targets), N, V, ldl] {
                cpu::crossentropy_forward<S>(l, x, t, N, V, ldl);
              });
    });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda::crossentropy_forward(launch(ctx), dtype, raw(losses), raw(logits), raw(targets), N, V, ldl);
#else
  cuda_backend_missing("kernels::crossentropy_forward");
#endif
}

void crossentropy_backward(KernelContext& ctx, DType dtype, Bytes dlogits, ConstBytes logits,
                           ConstTokens targets, float dloss, int N, int V, int row_stride) {
  const int ldl = logits_ld(V, row_stride);
  if (on_cpu(ctx)) {
    with_storage(dtype, [&](auto s) {
      using S = decltype(s);
      run_cpu(ctx, "crossentropy_backward",
              [dl = ptr<S>(dlogits), x = ptr<S>(logits), t = raw(targets), dloss, N, V, ldl] {
                cpu::crossentropy_backward<S>(dl, x, t, dloss, N, V, ldl);
              });
    });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda::crossentropy_backward(launch(ctx), dtype, raw(dlogits), raw(logits), raw(targets), dloss, N,
                              V, ldl);
#else
  cuda_backend_missing("kernels::crossentropy_backward");
#endif
}

void crossentropy_forward_backward(KernelContext& ctx, DType dtype, Floats losses, Bytes dlogits,
                                   ConstBytes logits, ConstTokens targets, float dloss, int N,
                                   int V, int row_stride) {
  const int ldl = logits_ld(V, row_stride);
  if (on_cpu(ctx)) {
    with_storage(dtype, [&](auto s) {
      using S = decltype(s);
      run_cpu(
          ctx, "crossentropy_forward_backward",
          [l = raw(losses), dl = ptr<S>(dlogits), x = ptr<S>(logits), t = raw(targets), dloss, N, V,
           ldl] { cpu::crossentropy_forward_backward<S>(l, dl, x, t, dloss, N, V, ldl); });
    });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda::crossentropy_forward_backward(launch(ctx), dtype, raw(losses), raw(dlogits), raw(logits),
                                      raw(targets), dloss, N, V, ldl);
#else
  cuda_backend_missing("kernels::crossentropy_forward_backward");
#endif
}

void loss_mean(KernelContext& ctx, Floats out, ConstFloats losses, int N, float divisor) {
  if (on_cpu(ctx)) {
    run_cpu(ctx, "loss_mean",
            [o = raw(out), l = raw(losses), N, divisor] { cpu::loss_mean(o, l, N, divisor); });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda::loss_mean(launch(ctx), raw(out), raw(losses), N, divisor);
#else
  cuda_backend_missing("kernels::loss_mean");
#endif
}

void rmsnorm_forward(KernelContext& ctx, DType dtype, Bytes out, Floats rstd, ConstBytes inp,
                     ConstBytes weight, int N, int C, double eps) {
  if (on_cpu(ctx)) {
    with_storage(dtype, [&](auto s) {
      using S = decltype(s);
      run_cpu(ctx, "rmsnorm_forward",
              [o = ptr<S>(out), r = raw(rstd), x = ptr<S>(inp), w = ptr<S>(weight), N, C, eps] {
                cpu::rmsnorm_forward<S>(o, r, x, w, N, C, eps);
              });
    });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda::rmsnorm_forward(launch(ctx), dtype, raw(out), raw(rstd), raw(inp), raw(weight), N, C, eps);
#else
  cuda_backend_missing("kernels::rmsnorm_forward");
#endif
}

void residual_rmsnorm_forward(KernelContext& ctx, DType dtype, Bytes res, Bytes out, Floats rstd,
                              ConstBytes a, ConstBytes b, ConstBytes weight, int N, int C,
                              double eps) {
  if (on_cpu(ctx)) {
    residual_forward(ctx, dtype, res, a, b, std::int64_t{N} * C);
    rmsnorm_forward(ctx, dtype, out, rstd, res, weight, N, C, eps);
    return;
  }
#if ZRT_HAVE_CUDA
  cuda::residual_rmsnorm_forward(launch(ctx), dtype, raw(res), raw(out), raw(rstd), raw(a), raw(b),
                                 raw(weight), N, C, eps);
#else
  cuda_backend_missing("kernels::residual_rmsnorm_forward");
#endif
}

void rmsnorm_backward(KernelContext& ctx, DType dtype, DType grad_dtype, Bytes dinp, Bytes dweight,
                      ConstBytes dout, ConstBytes inp, ConstBytes weight, ConstFloats rstd, int N,
                      int C) {
  if (on_cpu(ctx)) {
    with_storage_grad(dtype, grad_dtype, [&](auto s, auto g) {
      using S = decltype(s);
      using G = decltype(g);
      run_cpu(ctx, "rmsnorm_backward",
              [dx = ptr<S>(dinp), dw = ptr<G>(dweight), dy = ptr<S>(dout), x = ptr<S>(inp),
               w = ptr<S>(weight), r = raw(rstd), N,
               C] { cpu::rmsnorm_backward<S, G>(dx, dw, dy, x, w, r, N, C); });
    });
    return;
  }
#if ZRT_HAVE_CUDA
  check_dtypes(dtype, grad_dtype);
  cuda::rmsnorm_backward(launch(ctx, cuda::rmsnorm_backward_workspace(N, C)), dtype, grad_dtype,
                         raw(dinp), raw(dweight), raw(dout), raw(inp), raw(weight), raw(rstd), N,
                         C);
#else
  cuda_backend_missing("kernels::rmsnorm_backward");
#endif
}

void linear_forward(KernelContext& ctx, DType dtype, Bytes out, ConstBytes inp, ConstBytes weight,
                    ConstBytes bias, int N, int C, int OC) {
  if (on_cpu(ctx)) {
    with_storage(dtype, [&](auto s) {
      using S = decltype(s);
      auto* ws = cpu_workspace<cpu::acc_t<S>>(ctx, cpu::linear_forward_workspace<S>(N, C, OC));
      run_cpu(ctx, "linear_forward",
              [o = ptr<S>(out), x = ptr<S>(inp), w = ptr<S>(weight), b = ptr<S>(bias), N, C, OC,
               ws] { cpu::linear_forward<S>(o, x, w, b, N, C, OC, ws); });
    });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda::linear_forward(launch(ctx), dtype, raw(out), raw(inp), raw(weight), raw(bias), N, C, OC);
#else
  cuda_backend_missing("kernels::linear_forward");
#endif
}

void linear_backward(KernelContext& ctx, DType dtype, DType grad_dtype, Bytes dinp, Bytes dweight,
                     Bytes dbias, ConstBytes dout, ConstBytes inp, ConstBytes weight, int N, int C,
                     int OC, GradWrite dinp_write) {
  if (on_cpu(ctx)) {
    with_storage_grad(dtype, grad_dtype, [&](auto s, auto g) {
      using S = decltype(s);
      using G = decltype(g);
      auto* ws = cpu_workspace<cpu::acc_t<S>>(ctx, cpu::linear_backward_workspace<S>(N, C, OC));
      run_cpu(ctx, "linear_backward",
              [dx = ptr<S>(dinp), dw = ptr<G>(dweight), db = ptr<G>(dbias), dy = ptr<S>(dout),
               x = ptr<S>(inp), w = ptr<S>(weight), N, C, OC, ws, dinp_write] {
                cpu::linear_backward<S, G>(dx, dw, db, dy, x, w, N, C, OC, ws, dinp_write);
              });
    });
    return;
  }
#if ZRT_HAVE_CUDA
  check_dtypes(dtype, grad_dtype);
  cuda::linear_backward(launch(ctx, cuda::linear_backward_workspace(N, OC)), dtype, grad_dtype,
                        raw(dinp), raw(dweight), raw(dbias), raw(dout), raw(inp), raw(weight), N, C,
                        OC, dinp_write);
#else
  cuda_backend_missing("kernels::linear_backward");
#endif
}

void rope_forward(KernelContext& ctx, DType dtype, Bytes out, ConstBytes inp,
                  const RopeTable& table, int B, int T, int NH, int hs, ConstTokens positions) {
  ZRT_CHECK(hs == 2 * table.pairs, "rope: head size {} but a table of {} pairs", hs, table.pairs);
  if (on_cpu(ctx)) {
    with_storage(dtype, [&](auto s) {
      using S = decltype(s);
      run_cpu(ctx, "rope_forward",
              [o = ptr<S>(out), x = ptr<S>(inp), table, B, T, NH, hs, pos = raw(positions)] {
                cpu::rope_forward<S>(o, x, table, B, T, NH, hs, pos);
              });
    });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda::rope_forward(launch(ctx), dtype, raw(out), raw(inp), table, B, T, NH, hs, raw(positions));
#else
  cuda_backend_missing("kernels::rope_forward");
#endif
}

void rope_backward(KernelContext& ctx, DType dtype, Bytes dinp, ConstBytes dout,
                   const RopeTable& table, int B, int T, int NH, int hs, ConstTokens positions) {
  ZRT_CHECK(hs == 2 * table.pairs, "rope: head size {} but a table of {} pairs", hs, table.pairs);
  if (on_cpu(ctx)) {
    with_storage(dtype, [&](auto s) {
      using S = decltype(s);
      run_cpu(ctx, "rope_backward",
              [dx = ptr<S>(dinp), dy = ptr<S>(dout), table, B, T, NH, hs, pos = raw(positions)] {
                cpu::rope_backward<S>(dx, dy, table, B, T, NH, hs, pos);
              });
    });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda::rope_backward(launch(ctx), dtype, raw(dinp), raw(dout), table, B, T, NH, hs,
                      raw(positions));
#else
  cuda_backend_missing("kernels::rope_backward");
#endif
}

void swiglu_forward(KernelContext& ctx, DType dtype, Bytes out, ConstBytes gate, ConstBytes up,
                    std::int64_t n) {
  if (on_cpu(ctx)) {
    with_storage(dtype, [&](auto s) {
      using S = decltype(s);
      run_cpu(ctx, "swiglu_forward", [o = ptr<S>(out), g = ptr<S>(gate), u = ptr<S>(up), n] {
        cpu::swiglu_forward<S>(o, g, u, n);
      });
    });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda::swiglu_forward(launch(ctx), dtype, raw(out), raw(gate), raw(up), n);
#else
  cuda_backend_missing("kernels::swiglu_forward");
#endif
}

void swiglu_backward(KernelContext& ctx, DType dtype, Bytes dgate, Bytes dup, ConstBytes dout,
                     ConstBytes gate, ConstBytes up, std::int64_t n) {
  if (on_cpu(ctx)) {
    with_storage(dtype, [&](auto s) {
      using S = decltype(s);
      run_cpu(ctx, "swiglu_backward",
              [dg = ptr<S>(dgate), du = ptr<S>(dup), dy = ptr<S>(dout), g = ptr<S>(gate),
               u = ptr<S>(up), n] { cpu::swiglu_backward<S>(dg, du, dy, g, u, n); });
    });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda::swiglu_backward(launch(ctx), dtype, raw(dgate), raw(dup), raw(dout), raw(gate), raw(up), n);
#else
  cuda_backend_missing("kernels::swiglu_backward");
#endif
}

void gqa_attention_forward(KernelContext& ctx, DType dtype, Bytes out, Floats lse, ConstBytes q,
                           ConstBytes k, ConstBytes v, int B, int T, int NH, int NKV, int hs,
                           ConstTokens doc_start, int window) {
  ZRT_CHECK(NH > 0 && NKV > 0 && NH % NKV == 0, "gqa attention: NH={} is not a multiple of NKV={}",
            NH, NKV);
  window = cpu::effective_window(window, T);
  if (on_cpu(ctx)) {
    with_storage(dtype, [&](auto s) {
      using S = decltype(s);
      auto* ws = cpu_workspace<cpu::acc_t<S>>(
          ctx, cpu::gqa_attention_forward_workspace<S>(B, T, NH, NKV, hs));
      run_cpu(ctx, "gqa_attention_forward",
              [o = ptr<S>(out), l = raw(lse), qp = ptr<S>(q), kp = ptr<S>(k), vp = ptr<S>(v), B, T,
               NH, NKV, hs, ws, ds = raw(doc_start), window] {
                cpu::gqa_attention_forward<S>(o, l, qp, kp, vp, B, T, NH, NKV, hs, ws, ds, window);
              });
    });
    return;
  }
#if ZRT_HAVE_CUDA
  const cuda::AttentionKernels kernels = cuda::attention_kernels(ctx.options());
  const std::int64_t own_workspace =
      cuda::gqa_attention_forward_workspace(dtype, B, T, NH, NKV, hs, kernels);
  if (cuda::cudnn_attention_may_take(ctx.options(), dtype, raw(doc_start) != nullptr) &&
      cuda::cudnn_attention_forward(ctx,
                                    {dtype, B, T, NH, NKV, hs, cuda::QkvLayout::kSeparate,
                                     kernels.cudnn_deterministic, window, own_workspace},
                                    raw(out), raw(lse), raw(q), raw(k), raw(v))) {
    return;
  }
  cuda::gqa_attention_forward(launch(ctx, own_workspace), dtype, raw(out), raw(lse), raw(q), raw(k),
                              raw(v), B, T, NH, NKV, hs, kernels, raw(doc_start), window);
#else
  cuda_backend_missing("kernels::gqa_attention_forward");
#endif
}

void gqa_attention_backward(KernelContext& ctx, DType dtype, Bytes dq, Bytes dk, Bytes dv,
                            ConstBytes dout, ConstBytes q, ConstBytes k, ConstBytes v,
                            ConstBytes out, ConstFloats lse, int B, int T, int NH, int NKV, int hs,
                            ConstTokens doc_start, int window, GradWrite d_write) {
  ZRT_CHECK(NH > 0 && NKV > 0 && NH % NKV == 0, "gqa attention: NH={} is not a multiple of NKV={}",
            NH, NKV);
  window = cpu::effective_window(window, T);
  const std::int64_t rows = std::int64_t{B} * T,
                     elem = static_cast<std::int64_t>(dtype_size(dtype));
  const std::int64_t dq_bytes = rows * NH * hs * elem, dkv_bytes = rows * NKV * hs * elem;
  if (on_cpu(ctx)) {
    with_storage(dtype, [&](auto s) {
      using S = decltype(s);
      auto* ws = cpu_workspace<cpu::acc_t<S>>(
          ctx, cpu::gqa_attention_backward_workspace<S>(B, T, NH, NKV, hs));
      run_cpu(ctx, "gqa_attention_backward",
              [dqp = ptr<S>(dq), dkp = ptr<S>(dk), dvp = ptr<S>(dv), dy = ptr<S>(dout),
               qp = ptr<S>(q), kp = ptr<S>(k), vp = ptr<S>(v), y = ptr<S>(out), l = raw(lse), B, T,
               NH, NKV, hs, ws, ds = raw(doc_start), window, d_write, rows, dq_bytes, dkv_bytes] {
                if (d_write == GradWrite::kIntoZeros) {
                  require_zeros(dqp, rows * NH * hs, "gqa_attention_backward", "dq");
                  require_zeros(dkp, rows * NKV * hs, "gqa_attention_backward", "dk");
                  require_zeros(dvp, rows * NKV * hs, "gqa_attention_backward", "dv");
                } else if (d_write == GradWrite::kOverwrite) {
                  std::memset(static_cast<void*>(dqp), 0, static_cast<std::size_t>(dq_bytes));
                  std::memset(static_cast<void*>(dkp), 0, static_cast<std::size_t>(dkv_bytes));
                  std::memset(static_cast<void*>(dvp), 0, static_cast<std::size_t>(dkv_bytes));
                }
                cpu::gqa_attention_backward<S>(dqp, dkp, dvp, dy, qp, kp, vp, y, l, B, T, NH, NKV,
                                               hs, ws, ds, window);
              });
    });
    return;
  }
#if ZRT_HAVE_CUDA
  const cuda::AttentionKernels kernels = cuda::attention_kernels(ctx.options());
  const std::int64_t own_workspace =
      cuda::gqa_attention_backward_workspace(dtype, B, T, NH, NKV, hs, kernels);
  if (cuda::cudnn_attention_may_take(ctx.options(), dtype, raw(doc_start) != nullptr) &&
      cuda::cudnn_attention_backward(ctx,
                                     {dtype, B, T, NH, NKV, hs, cuda::QkvLayout::kSeparate,
                                      kernels.cudnn_deterministic, window, own_workspace},
                                     raw(dq), raw(dk), raw(dv), raw(dout), raw(q), raw(k), raw(v),
                                     raw(out), raw(lse), cudnn_writes_in_place(d_write))) {
    return;
  }
  if (d_write == GradWrite::kOverwrite) {
    ctx.device().fill_zero(dq, static_cast<std::size_t>(dq_bytes), ctx.stream());
    ctx.device().fill_zero(dk, static_cast<std::size_t>(dkv_bytes), ctx.stream());
    ctx.device().fill_zero(dv, static_cast<std::size_t>(dkv_bytes), ctx.stream());
  }
  cuda::gqa_attention_backward(launch(ctx, own_workspace), dtype, raw(dq), raw(dk), raw(dv),
                               raw(dout), raw(q), raw(k), raw(v), raw(out), raw(lse), B, T, NH, NKV,
                               hs, kernels, raw(doc_start), window);
#else
  cuda_backend_missing("kernels::gqa_attention_backward");
#endif
}

namespace {

// The kernel choice planning counts: the options', less cuDNN in a CUDA build without it.
cuda::AttentionKernels planned_kernels(const KernelOptions& options) {
  cuda::AttentionKernels kernels = cuda::attention_kernels(options);
#if ZRT_HAVE_CUDA
  kernels.cudnn = kernels.cudnn && cuda::cudnn_attention_built();
#endif
  return kernels;
}

// The request planning counts for one pass: cuDNN's where the calls would take it, else zrt's
// kernels' `own`.
std::int64_t planned_request(const cuda::AttentionKernels& kernels, DType dtype, bool documents,
                             int B, int T, int NH, int NKV, int hs, bool backward,
                             std::int64_t own) {
  return cuda::cudnn_attention_planned(kernels, dtype, documents, B, T, NH, NKV, hs, backward, own)
             ? cuda::cudnn_attention_workspace_estimate(B, T, NH, NKV, hs, backward,
                                                        kernels.cudnn_deterministic)
             : own;
}

}  // namespace

std::string describe_cuda_attention(const KernelOptions& options) {
  return cuda::describe(planned_kernels(options));
}

std::string describe_cuda_fused_paths(KernelContext& ctx) {
#if ZRT_HAVE_CUDA
  if (ctx.cuda() != nullptr) return cuda::describe_fused_paths(*ctx.cuda());
#endif
  (void)ctx;
  return "";
}

std::int64_t attention_workspace_bytes(bool on_cpu, const KernelOptions& options, DType dtype,
                                       int B, int T, int C, int NH, bool backward, bool documents) {
  if (on_cpu) {
    std::int64_t bytes = 0;
    with_storage(dtype, [&](auto s) {
      using S = decltype(s);
      const std::int64_t count = backward ? cpu::attention_backward_workspace<S>(B, T, C, NH)
                                          : cpu::attention_forward_workspace<S>(B, T, C, NH);
      bytes = count * static_cast<std::int64_t>(sizeof(cpu::acc_t<S>));
    });
    return bytes;
  }
  // Host arithmetic (attention_plan.h): a build without CUDA plans a CUDA run's workspace too.
  const cuda::AttentionKernels kernels = planned_kernels(options);
  const std::int64_t own = backward
                               ? cuda::attention_backward_workspace(dtype, B, T, C, NH, kernels)
                               : cuda::attention_forward_workspace(dtype, B, T, C, NH, kernels);
  return planned_request(kernels, dtype, documents, B, T, NH, NH, C / NH, backward, own);
}

std::int64_t gqa_attention_workspace_bytes(bool on_cpu, const KernelOptions& options, DType dtype,
                                           int B, int T, int NH, int NKV, int hs, bool backward,
                                           bool documents) {
  if (on_cpu) {
    std::int64_t bytes = 0;
    with_storage(dtype, [&](auto s) {
      using S = decltype(s);
      const std::int64_t count = backward
                                     ? cpu::gqa_attention_backward_workspace<S>(B, T, NH, NKV, hs)
                                     : cpu::gqa_attention_forward_workspace<S>(B, T, NH, NKV, hs);
      bytes = count * static_cast<std::int64_t>(sizeof(cpu::acc_t<S>));
    });
    return bytes;
  }
  const cuda::AttentionKernels kernels = planned_kernels(options);
  const std::int64_t own =
      backward ? cuda::gqa_attention_backward_workspace(dtype, B, T, NH, NKV, hs, kernels)
               : cuda::gqa_attention_forward_workspace(dtype, B, T, NH, NKV, hs, kernels);
  return planned_request(kernels, dtype, documents, B, T, NH, NKV, hs, backward, own);
}

}  // namespace zrt::kernels
