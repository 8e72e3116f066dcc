#include "kernels/cpu/rmsnorm.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace zrt::kernels::cpu {

namespace {
constexpr int kRmsnormChannelBlock = 64;  // channels per task of the column sums
}  // namespace

template <typename S>
void rmsnorm_forward(S* out, acc_t<S>* rstd, const S* inp, const S* weight, int N, int C,
                     double eps) {
  using A = acc_t<S>;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const S* x = inp + static_cast<std::int64_t>(n) * C;
    S* o = out + static_cast<std::int64_t>(n) * C;
    A sumsq = 0;
    for (int c = 0; c < C; ++c) {
      const A v = load<A>(x[c]);
      sumsq += v * v;
    }
    const A s = A(1) / std::sqrt(sumsq / static_cast<A>(C) + static_cast<A>(eps));
    for (int c = 0; c < C; ++c) o[c] = store<S>(load<A>(x[c]) * s * load<A>(weight[c]));
    rstd[n] = s;
  }
}

template <typename S, typename G>
void rmsnorm_backward(S* dinp, G* dweight, const S* dout, const S* inp, const S* weight,
                      const acc_t<S>* rstd, int N, int C) {
  using A = acc_t<S>;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const std::int64_t off = static_cast<std::int64_t>(n) * C;
    const S* x = inp + off;
    const S* dy = dout + off;
    S* dx = dinp + off;
    const A s = rstd[n];
    A gn_mean = 0;
    for (int c = 0; c < C; ++c) {
      gn_mean += load<A>(dy[c]) * load<A>(weight[c]) * (load<A>(x[c]) * s);
    }
    gn_mean /= static_cast<A>(C);
    for (int c = 0; c < C; ++c) {
      const A norm = load<A>(x[c]) * s;
      const A g = load<A>(dy[c]) * load<A>(weight[c]);
      dx[c] = store<S>(load<A>(dx[c]) + (g - norm * gn_mean) * s);
    }
  }
  if (dweight == nullptr) return;  // a frozen weight: no column sums
  const int blocks = (C + kRmsnormChannelBlock - 1) / kRmsnormChannelBlock;
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < blocks; ++blk) {
    const int c0 = blk * kRmsnormChannelBlock;
    const int c1 = std::min(C, c0 + kRmsnormChannelBlock);
    A dw[kRmsnormChannelBlock] = {};
    for (int n = 0; n < N; ++n) {
      const std::int64_t off = static_cast<std::int64_t>(n) * C;
      const A s = rstd[n];
      for (int c = c0; c < c1; ++c)
        dw[c - c0] += load<A>(dout[off + c]) * (load<A>(inp[off + c]) * s);
    }
    for (int c = c0; c < c1; ++c) dweight[c] = store<G>(load<A>(dweight[c]) + dw[c - c0]);
  }
}

#define ZRT_FWD(S) \
  template void rmsnorm_forward<S>(S*, acc_t<S>*, const S*, const S*, int, int, double);
#define ZRT_BWD(S, G)                                                                              \
  template void rmsnorm_backward<S, G>(S*, G*, const S*, const S*, const S*, const acc_t<S>*, int, \
                                       int);
ZRT_FWD(float)
ZRT_FWD(double)
ZRT_FWD(bf16)
ZRT_FWD(fp16)
ZRT_BWD(float, float)
ZRT_BWD(double, double)
ZRT_BWD(bf16, bf16)
ZRT_BWD(bf16, float)
ZRT_BWD(fp16, fp16)
ZRT_BWD(fp16, float)
#undef ZRT_FWD
#undef ZRT_BWD

}  // namespace zrt::kernels::cpu
