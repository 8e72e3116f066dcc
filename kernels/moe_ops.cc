#include "kernels/moe_ops.h"

#include "kernels/cpu/grouped_linear.h"
#include "kernels/cpu/moe_permute.h"
#include "kernels/cpu/moe_router.h"
#include "kernels/cpu/moe_shared_gate.h"
#include "kernels/op_dispatch.h"
#include "runtime/common/error.h"

#if ZRT_HAVE_CUDA
#include "kernels/cuda/grouped_linear.cuh"
#include "kernels/cuda/moe_permute.cuh"
#include "kernels/cuda/moe_router.cuh"
#include "kernels/cuda/moe_shared_gate.cuh"
#endif

namespace zrt::kernels {

namespace {

using dispatch::cpu_workspace;
using dispatch::on_cpu;
using dispatch::ptr;
using dispatch::raw;
using dispatch::run_cpu;
using dispatch::with_storage;
using dispatch::with_storage_grad;
#if ZRT_HAVE_CUDA
using dispatch::launch;
#endif

void check_router(const char* op, int N, int E, int k) {
  if (N < 0 || E < 1 || k < 1 || k > E || k > kMoeMaxTopK) {
    ZRT_THROW(InvalidArgument, "{}: N {} rows, top-{} of E {} experts (1 <= k <= min(E, {}))", op,
              N, k, E, kMoeMaxTopK);
  }
}

void check_offsets(const char* op, const std::vector<std::int32_t>& offsets, int E) {
  if (E < 1 || offsets.size() != static_cast<std::size_t>(E) + 1) {
    ZRT_THROW(InvalidArgument, "{}: {} offsets for {} experts (E + 1 expected)", op, offsets.size(),
              E);
  }
  if (offsets[0] < 0) ZRT_THROW(InvalidArgument, "{}: offsets[0] = {} < 0", op, offsets[0]);
  for (int e = 0; e < E; ++e) {
    if (offsets[e] > offsets[e + 1]) {
      ZRT_THROW(InvalidArgument, "{}: offsets[{}] = {} > offsets[{}] = {}", op, e, offsets[e],
                e + 1, offsets[e + 1]);
    }
  }
}

void check_weight_stride(const char* op, std::int64_t weight_stride, int IC, int OC) {
  if (weight_stride != 0 && weight_stride < std::int64_t{OC} * IC) {
    ZRT_THROW(InvalidArgument, "{}: weight_stride {} below one expert's {} x {} weight", op,
              weight_stride, OC, IC);
  }
}

void check_sizes(const char* op, int N, int k, int E) {
  if (N < 0 || k < 1 || E < 1 || std::int64_t{N} * k > INT32_MAX) {
    ZRT_THROW(InvalidArgument, "{}: N {}, k {}, E {} (N*k pairs must fit int32)", op, N, k, E);
  }
}

}  // namespace

void moe_router_forward(KernelContext& ctx, DType dtype, Floats probs, Floats weights, Ints experts,
                        ConstBytes logits, int N, int E, int k, bool renormalize) {
  check_router("moe_router_forward", N, E, k);
  if (on_cpu(ctx)) {
    with_storage(dtype, [&](auto s) {
      using S = decltype(s);
      run_cpu(ctx, "moe_router_forward",
              [p = raw(probs), w = raw(weights), idx = raw(experts), l = ptr<S>(logits), N, E, k,
               renormalize] { cpu::moe_router_forward<S>(p, w, idx, l, N, E, k, renormalize); });
    });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda::moe_router_forward(launch(ctx), dtype, raw(probs), raw(weights), raw(experts), raw(logits),
                           N, E, k, renormalize);
#else
  cuda_backend_missing("kernels::moe_router_forward");
#endif
}

void moe_router_backward(KernelContext& ctx, DType dtype, Bytes dlogits, ConstFloats dweights,
                         ConstFloats probs, ConstInts experts, ConstFloats dprobs_shared, int N,
                         int E, int k, bool renormalize, GradWrite dlogits_write) {
  check_router("moe_router_backward", N, E, k);
  if (on_cpu(ctx)) {
    with_storage(dtype, [&](auto s) {
      using S = decltype(s);
      run_cpu(ctx, "moe_router_backward",
              [dl = ptr<S>(dlogits), dw = raw(dweights), p = raw(probs), idx = raw(experts),
               ds = raw(dprobs_shared), N, E, k, renormalize, dlogits_write] {
                cpu::moe_router_backward<S>(dl, dw, p, idx, ds, N, E, k, renormalize,
                                            dlogits_write);
              });
    });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda::moe_router_backward(launch(ctx), dtype, raw(dlogits), raw(dweights), raw(probs),
                            raw(experts), raw(dprobs_shared), N, E, k, renormalize, dlogits_write);
#else
  cuda_backend_missing("kernels::moe_router_backward");
#endif
}

void moe_aux_stats_accumulate(KernelContext& ctx, Floats counts, Floats probsum, ConstFloats probs,
                              ConstInts experts, int N, int E, int k) {
  check_router("moe_aux_stats_accumulate", N, E, k);
  if (on_cpu(ctx)) {
    run_cpu(ctx, "moe_aux_stats_accumulate",
            [c = raw(counts), ps = raw(probsum), p = raw(probs), idx = raw(experts), N, E, k] {
              cpu::moe_aux_stats_accumulate<float>(c, ps, p, idx, N, E, k);
            });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda::moe_aux_stats_accumulate(launch(ctx), raw(counts), raw(probsum), raw(probs), raw(experts),
                                 N, E, k);
#else
  cuda_backend_missing("kernels::moe_aux_stats_accumulate");
#endif
}

void moe_load_balancing_loss(KernelContext& ctx, Floats loss, ConstFloats counts,
                             ConstFloats probsum, int E, std::int64_t total_rows) {
  if (E < 1 || total_rows < 1) {
    ZRT_THROW(InvalidArgument, "moe_load_balancing_loss: E {} experts, {} rows", E, total_rows);
  }
  if (on_cpu(ctx)) {
    run_cpu(ctx, "moe_load_balancing_loss",
            [out = raw(loss), c = raw(counts), ps = raw(probsum), E, total_rows] {
              cpu::moe_load_balancing_loss<float>(out, c, ps, E, total_rows);
            });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda::moe_load_balancing_loss(launch(ctx), raw(loss), raw(counts), raw(probsum), E, total_rows);
#else
  cuda_backend_missing("kernels::moe_load_balancing_loss");
#endif
}

void moe_add_loss_term(KernelContext& ctx, Floats loss, ConstFloats term, float coef) {
  if (on_cpu(ctx)) {
    run_cpu(ctx, "moe_add_loss_term", [out = raw(loss), t = raw(term), coef] {
      cpu::moe_add_loss_term<float>(out, t, coef);
    });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda::moe_add_loss_term(launch(ctx), raw(loss), raw(term), coef);
#else
  cuda_backend_missing("kernels::moe_add_loss_term");
#endif
}

void moe_load_balancing_loss_backward(KernelContext& ctx, Floats dprobs_shared, ConstFloats counts,
                                      float dloss, int E, std::int64_t total_rows) {
  if (E < 1 || total_rows < 1) {
    ZRT_THROW(InvalidArgument, "moe_load_balancing_loss_backward: E {} experts, {} rows", E,
              total_rows);
  }
  if (on_cpu(ctx)) {
    run_cpu(ctx, "moe_load_balancing_loss_backward",
            [d = raw(dprobs_shared), c = raw(counts), dloss, E, total_rows] {
              cpu::moe_load_balancing_loss_backward<float>(d, c, dloss, E, total_rows);
            });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda::moe_load_balancing_loss_backward(launch(ctx), raw(dprobs_shared), raw(counts), dloss, E,
                                         total_rows);
#else
  cuda_backend_missing("kernels::moe_load_balancing_loss_backward");
#endif
}

void moe_router_z_loss_forward(KernelContext& ctx, DType dtype, Floats loss, ConstBytes logits,
                               int N, int E) {
  if (N < 0 || E < 1) ZRT_THROW(InvalidArgument, "moe_router_z_loss_forward: N {}, E {}", N, E);
  if (on_cpu(ctx)) {
    with_storage(dtype, [&](auto s) {
      using S = decltype(s);
      run_cpu(ctx, "moe_router_z_loss_forward", [out = raw(loss), l = ptr<S>(logits), N, E] {
        cpu::moe_router_z_loss_forward<S>(out, l, N, E);
      });
    });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda::moe_router_z_loss_forward(launch(ctx), dtype, raw(loss), raw(logits), N, E);
#else
  cuda_backend_missing("kernels::moe_router_z_loss_forward");
#endif
}

void moe_router_z_loss_backward(KernelContext& ctx, DType dtype, Bytes dlogits, ConstBytes logits,
                                float dloss, int N, int E) {
  if (N < 0 || E < 1) ZRT_THROW(InvalidArgument, "moe_router_z_loss_backward: N {}, E {}", N, E);
  if (on_cpu(ctx)) {
    with_storage(dtype, [&](auto s) {
      using S = decltype(s);
      run_cpu(ctx, "moe_router_z_loss_backward",
              [dl = ptr<S>(dlogits), l = ptr<S>(logits), dloss, N, E] {
                cpu::moe_router_z_loss_backward<S>(dl, l, dloss, N, E);
              });
    });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda::moe_router_z_loss_backward(launch(ctx), dtype, raw(dlogits), raw(logits), dloss, N, E);
#else
  cuda_backend_missing("kernels::moe_router_z_loss_backward");
#endif
}

void moe_dispatch_plan(KernelContext& ctx, Ints counts, Ints offsets, Ints row_of, Ints source,
                       ConstInts experts, int N, int k, int E) {
  check_sizes("moe_dispatch_plan", N, k, E);
  if (on_cpu(ctx)) {
    run_cpu(ctx, "moe_dispatch_plan",
            [c = raw(counts), o = raw(offsets), r = raw(row_of), src = raw(source),
             idx = raw(experts), N, k, E] { cpu::moe_dispatch_plan(c, o, r, src, idx, N, k, E); });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda::moe_dispatch_plan(launch(ctx), raw(counts), raw(offsets), raw(row_of), raw(source),
                          raw(experts), N, k, E);
#else
  cuda_backend_missing("kernels::moe_dispatch_plan");
#endif
}

void moe_gather(KernelContext& ctx, DType dtype, Bytes xe, ConstBytes x, ConstInts row_of, int N,
                int k, int C) {
  if (on_cpu(ctx)) {
    with_storage(dtype, [&](auto s) {
      using S = decltype(s);
      run_cpu(ctx, "moe_gather", [o = ptr<S>(xe), in = ptr<S>(x), r = raw(row_of), N, k, C] {
        cpu::moe_gather<S>(o, in, r, N, k, C);
      });
    });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda::moe_gather(launch(ctx), dtype, raw(xe), raw(x), raw(row_of), N, k, C);
#else
  cuda_backend_missing("kernels::moe_gather");
#endif
}

void moe_gather_backward(KernelContext& ctx, DType dtype, Bytes dx, ConstBytes dxe,
                         ConstInts row_of, int N, int k, int C) {
  if (on_cpu(ctx)) {
    with_storage(dtype, [&](auto s) {
      using S = decltype(s);
      run_cpu(ctx, "moe_gather_backward",
              [d = ptr<S>(dx), de = ptr<S>(dxe), r = raw(row_of), N, k, C] {
                cpu::moe_gather_backward<S>(d, de, r, N, k, C);
              });
    });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda::moe_gather_backward(launch(ctx), dtype, raw(dx), raw(dxe), raw(row_of), N, k, C);
#else
  cuda_backend_missing("kernels::moe_gather_backward");
#endif
}

void moe_combine(KernelContext& ctx, DType dtype, Bytes out, ConstBytes y, ConstFloats weights,
                 ConstInts row_of, int N, int k, int C) {
  if (on_cpu(ctx)) {
    with_storage(dtype, [&](auto s) {
      using S = decltype(s);
      run_cpu(ctx, "moe_combine",
              [o = ptr<S>(out), ye = ptr<S>(y), w = raw(weights), r = raw(row_of), N, k, C] {
                cpu::moe_combine<S>(o, ye, w, r, N, k, C);
              });
    });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda::moe_combine(launch(ctx), dtype, raw(out), raw(y), raw(weights), raw(row_of), N, k, C);
#else
  cuda_backend_missing("kernels::moe_combine");
#endif
}

void moe_combine_backward(KernelContext& ctx, DType dtype, Bytes dy, Floats dweights,
                          ConstBytes dout, ConstBytes y, ConstFloats weights, ConstInts row_of,
                          int N, int k, int C) {
  if (on_cpu(ctx)) {
    with_storage(dtype, [&](auto s) {
      using S = decltype(s);
      run_cpu(ctx, "moe_combine_backward",
              [d = ptr<S>(dy), dw = raw(dweights), g = ptr<S>(dout), ye = ptr<S>(y),
               w = raw(weights), r = raw(row_of), N, k,
               C] { cpu::moe_combine_backward<S>(d, dw, g, ye, w, r, N, k, C); });
    });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda::moe_combine_backward(launch(ctx), dtype, raw(dy), raw(dweights), raw(dout), raw(y),
                             raw(weights), raw(row_of), N, k, C);
#else
  cuda_backend_missing("kernels::moe_combine_backward");
#endif
}

void grouped_linear_forward(KernelContext& ctx, DType dtype, Bytes out, ConstBytes inp,
                            ConstBytes weight, const std::vector<std::int32_t>& offsets, int E,
                            int IC, int OC, std::int64_t weight_stride) {
  check_offsets("grouped_linear_forward", offsets, E);
  check_weight_stride("grouped_linear_forward", weight_stride, IC, OC);
  if (on_cpu(ctx)) {
    with_storage(dtype, [&](auto s) {
      using S = decltype(s);
      auto* ws = cpu_workspace<cpu::acc_t<S>>(
          ctx, cpu::grouped_linear_forward_workspace<S>(offsets.data(), E, IC, OC));
      run_cpu(ctx, "grouped_linear_forward",
              [o = ptr<S>(out), x = ptr<S>(inp), w = ptr<S>(weight), offsets, E, IC, OC, ws,
               weight_stride] {
                cpu::grouped_linear_forward<S>(o, x, w, offsets.data(), E, IC, OC, ws,
                                               weight_stride);
              });
    });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda::grouped_linear_forward(launch(ctx), dtype, raw(out), raw(inp), raw(weight), offsets.data(),
                               E, IC, OC, weight_stride);
#else
  cuda_backend_missing("kernels::grouped_linear_forward");
#endif
}

void grouped_linear_backward(KernelContext& ctx, DType dtype, DType grad_dtype, Bytes dinp,
                             Bytes dweight, ConstBytes dout, ConstBytes inp, ConstBytes weight,
                             const std::vector<std::int32_t>& offsets, int E, int IC, int OC,
                             GradWrite dinp_write, std::int64_t weight_stride) {
  check_offsets("grouped_linear_backward", offsets, E);
  check_weight_stride("grouped_linear_backward", weight_stride, IC, OC);
  if (on_cpu(ctx)) {
    with_storage_grad(dtype, grad_dtype, [&](auto s, auto g) {
      using S = decltype(s);
      using G = decltype(g);
      auto* ws = cpu_workspace<cpu::acc_t<S>>(
          ctx, cpu::grouped_linear_backward_workspace<S>(offsets.data(), E, IC, OC));
      run_cpu(ctx, "grouped_linear_backward",
              [dx = ptr<S>(dinp), dw = ptr<G>(dweight), dy = ptr<S>(dout), x = ptr<S>(inp),
               w = ptr<S>(weight), offsets, E, IC, OC, ws, dinp_write, weight_stride] {
                cpu::grouped_linear_backward<S, G>(dx, dw, dy, x, w, offsets.data(), E, IC, OC, ws,
                                                   dinp_write, weight_stride);
              });
    });
    return;
  }
#if ZRT_HAVE_CUDA
  check_dtypes(dtype, grad_dtype);
  cuda::grouped_linear_backward(launch(ctx), dtype, grad_dtype, raw(dinp), raw(dweight), raw(dout),
                                raw(inp), raw(weight), offsets.data(), E, IC, OC, dinp_write,
                                weight_stride);
#else
  cuda_backend_missing("kernels::grouped_linear_backward");
#endif
}

void moe_shared_gate_forward(KernelContext& ctx, DType dtype, Bytes out, ConstBytes s, ConstBytes g,
                             int N, int C) {
  if (N < 0 || C < 1) ZRT_THROW(InvalidArgument, "moe_shared_gate_forward: N {}, C {}", N, C);
  if (on_cpu(ctx)) {
    with_storage(dtype, [&](auto st) {
      using S = decltype(st);
      run_cpu(ctx, "moe_shared_gate_forward",
              [o = ptr<S>(out), sp = ptr<S>(s), gp = ptr<S>(g), N, C] {
                cpu::moe_shared_gate_forward<S>(o, sp, gp, N, C);
              });
    });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda::moe_shared_gate_forward(launch(ctx), dtype, raw(out), raw(s), raw(g), N, C);
#else
  cuda_backend_missing("kernels::moe_shared_gate_forward");
#endif
}

void moe_shared_gate_backward(KernelContext& ctx, DType dtype, Bytes ds, Bytes dg, ConstBytes dout,
                              ConstBytes s, ConstBytes g, int N, int C) {
  if (N < 0 || C < 1) ZRT_THROW(InvalidArgument, "moe_shared_gate_backward: N {}, C {}", N, C);
  if (on_cpu(ctx)) {
    with_storage(dtype, [&](auto st) {
      using S = decltype(st);
      run_cpu(ctx, "moe_shared_gate_backward",
              [dsp = ptr<S>(ds), dgp = ptr<S>(dg), d = ptr<S>(dout), sp = ptr<S>(s), gp = ptr<S>(g),
               N, C] { cpu::moe_shared_gate_backward<S>(dsp, dgp, d, sp, gp, N, C); });
    });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda::moe_shared_gate_backward(launch(ctx), dtype, raw(ds), raw(dg), raw(dout), raw(s), raw(g), N,
                                 C);
#else
  cuda_backend_missing("kernels::moe_shared_gate_backward");
#endif
}

}  // namespace zrt::kernels
