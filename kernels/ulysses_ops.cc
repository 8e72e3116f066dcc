#include "kernels/ulysses_ops.h"

#include "kernels/cpu/ulysses_layout.h"
#include "kernels/op_dispatch.h"

#if ZRT_HAVE_CUDA
#include "kernels/cuda/ulysses_layout.cuh"
#endif

namespace zrt::kernels {

using dispatch::on_cpu;
using dispatch::ptr;
using dispatch::run_cpu;
using dispatch::with_storage;
#if ZRT_HAVE_CUDA
using dispatch::launch;
using dispatch::raw;
#endif

UlyssesHeads ulysses_query_heads(int NH, int sp) {
  ZRT_CHECK(sp > 0 && NH > 0 && NH % sp == 0,
            "sequence parallelism: {} query heads do not split over {} ranks", NH, sp);
  return {NH, NH / sp, NH / sp, 1};
}

UlyssesHeads ulysses_kv_heads(int NH, int NKV, int sp) {
  const UlyssesHeads q = ulysses_query_heads(NH, sp);
  ZRT_CHECK(NKV > 0 && NH % NKV == 0,
            "sequence parallelism: {} query heads are not groups of {} "
            "key/value heads",
            NH, NKV);
  ZRT_CHECK(NKV % sp == 0 || sp % NKV == 0,
            "sequence parallelism: {} key/value heads neither split over {} ranks nor divide them",
            NKV, sp);
  return {NKV, NKV >= sp ? NKV / sp : 1, q.heads_per_rank, NH / NKV};
}

void ulysses_scatter_heads(KernelContext& ctx, DType dtype, Bytes out, ConstBytes in, int sp, int B,
                           int Tl, const UlyssesHeads& heads, int hs) {
  const UlyssesHeads h = heads;
  if (on_cpu(ctx)) {
    with_storage(dtype, [&](auto s) {
      using S = decltype(s);
      run_cpu(ctx, "ulysses_scatter_heads", [o = ptr<S>(out), i = ptr<S>(in), sp, B, Tl, h, hs] {
        cpu::ulysses_scatter_heads<S>(o, i, sp, B, Tl, h.heads, h.block_heads, hs, h.heads_per_rank,
                                      h.group);
      });
    });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda::ulysses_scatter_heads(launch(ctx), dtype, raw(out), raw(in), sp, B, Tl, h.heads,
                              h.block_heads, hs, h.heads_per_rank, h.group);
#else
  cuda_backend_missing("kernels::ulysses_scatter_heads");
#endif
}

void ulysses_scatter_heads_backward(KernelContext& ctx, DType dtype, Bytes din, ConstBytes dout,
                                    int sp, int B, int Tl, const UlyssesHeads& heads, int hs) {
  const UlyssesHeads h = heads;
  if (on_cpu(ctx)) {
    with_storage(dtype, [&](auto s) {
      using S = decltype(s);
      run_cpu(ctx, "ulysses_scatter_heads_backward",
              [dx = ptr<S>(din), dy = ptr<S>(dout), sp, B, Tl, h, hs] {
                cpu::ulysses_scatter_heads_backward<S>(dx, dy, sp, B, Tl, h.heads, h.block_heads,
                                                       hs, h.heads_per_rank, h.group);
              });
    });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda::ulysses_scatter_heads_backward(launch(ctx), dtype, raw(din), raw(dout), sp, B, Tl, h.heads,
                                       h.block_heads, hs, h.heads_per_rank, h.group);
#else
  cuda_backend_missing("kernels::ulysses_scatter_heads_backward");
#endif
}

void ulysses_gather_sequence(KernelContext& ctx, DType dtype, Bytes out, ConstBytes in, int sp,
                             int B, int Tl, int Hd, int hs) {
  if (on_cpu(ctx)) {
    with_storage(dtype, [&](auto s) {
      using S = decltype(s);
      run_cpu(ctx, "ulysses_gather_sequence", [o = ptr<S>(out), i = ptr<S>(in), sp, B, Tl, Hd, hs] {
        cpu::ulysses_gather_sequence<S>(o, i, sp, B, Tl, Hd, hs);
      });
    });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda::ulysses_gather_sequence(launch(ctx), dtype, raw(out), raw(in), sp, B, Tl, Hd, hs);
#else
  cuda_backend_missing("kernels::ulysses_gather_sequence");
#endif
}

void ulysses_scatter_sequence(KernelContext& ctx, DType dtype, Bytes out, ConstBytes in, int sp,
                              int B, int Tl, int Hd, int hs) {
  if (on_cpu(ctx)) {
    with_storage(dtype, [&](auto s) {
      using S = decltype(s);
      run_cpu(ctx, "ulysses_scatter_sequence",
              [o = ptr<S>(out), i = ptr<S>(in), sp, B, Tl, Hd, hs] {
                cpu::ulysses_scatter_sequence<S>(o, i, sp, B, Tl, Hd, hs);
              });
    });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda::ulysses_scatter_sequence(launch(ctx), dtype, raw(out), raw(in), sp, B, Tl, Hd, hs);
#else
  cuda_backend_missing("kernels::ulysses_scatter_sequence");
#endif
}

void ulysses_gather_heads(KernelContext& ctx, DType dtype, Bytes out, ConstBytes in, int sp, int B,
                          int Tl, int Hd, int hs) {
  if (on_cpu(ctx)) {
    with_storage(dtype, [&](auto s) {
      using S = decltype(s);
      run_cpu(ctx, "ulysses_gather_heads", [o = ptr<S>(out), i = ptr<S>(in), sp, B, Tl, Hd, hs] {
        cpu::ulysses_gather_heads<S>(o, i, sp, B, Tl, Hd, hs);
      });
    });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda::ulysses_gather_heads(launch(ctx), dtype, raw(out), raw(in), sp, B, Tl, Hd, hs);
#else
  cuda_backend_missing("kernels::ulysses_gather_heads");
#endif
}

}  // namespace zrt::kernels
