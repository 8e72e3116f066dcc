#include "kernels/cpu/layernorm.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace zrt::kernels::cpu {

namespace {
constexpr int kLayernormChannelBlock = 64;  // channels per task of the column sums
}  // namespace

template <typename S>
void layernorm_forward(S* out, acc_t<S>* mean, acc_t<S>* rstd, const S* inp, const S* weight,
                       const S* bias, int N, int C) {
  using A = acc_t<S>;
  const A eps = static_cast<A>(kLayerNormEps);
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const S* x = inp + static_cast<std::int64_t>(n) * C;
    S* o = out + static_cast<std::int64_t>(n) * C;
    A sum = 0;
    for (int c = 0; c < C; ++c) sum += load<A>(x[c]);
    const A m = sum / static_cast<A>(C);
    A var = 0;
    for (int c = 0; c < C; ++c) {
      const A d = load<A>(x[c]) - m;
      var += d * d;
    }
    const A s = A(1) / std::sqrt(var / static_cast<A>(C) + eps);
    for (int c = 0; c < C; ++c) {
      const A norm = (load<A>(x[c]) - m) * s;
      o[c] = store<S>(norm * load<A>(weight[c]) + load<A>(bias[c]));
    }
    mean[n] = m;
    rstd[n] = s;
  }
}

template <typename S, typename G>
void layernorm_backward(S* dinp, G* dweight, G* dbias, const S* dout, const S* inp, const S* weight,
                        const acc_t<S>* mean, const acc_t<S>* rstd, int N, int C) {
  using A = acc_t<S>;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const std::int64_t off = static_cast<std::int64_t>(n) * C;
    const S* x = inp + off;
    const S* dy = dout + off;
    S* dx = dinp + off;
    const A m = mean[n];
    const A s = rstd[n];
    A g_mean = 0;
    A gn_mean = 0;
    for (int c = 0; c < C; ++c) {
      const A norm = (load<A>(x[c]) - m) * s;
      const A g = load<A>(dy[c]) * load<A>(weight[c]);
      g_mean += g;
      gn_mean += g * norm;
    }
    g_mean /= static_cast<A>(C);
    gn_mean /= static_cast<A>(C);
    for (int c = 0; c < C; ++c) {
      const A norm = (load<A>(x[c]) - m) * s;
      const A g = load<A>(dy[c]) * load<A>(weight[c]);
      dx[c] = store<S>(load<A>(dx[c]) + (g - g_mean - norm * gn_mean) * s);
    }
  }
  if (dweight == nullptr && dbias == nullptr) return;  // both frozen: no column sums
  const int blocks = (C + kLayernormChannelBlock - 1) / kLayernormChannelBlock;
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < blocks; ++blk) {
    const int c0 = blk * kLayernormChannelBlock;
    const int c1 = std::min(C, c0 + kLayernormChannelBlock);
    A dw[kLayernormChannelBlock] = {};
    A db[kLayernormChannelBlock] = {};
    for (int n = 0; n < N; ++n) {
      const std::int64_t off = static_cast<std::int64_t>(n) * C;
      const A m = mean[n];
      const A s = rstd[n];
      for (int c = c0; c < c1; ++c) {
        const A dy = load<A>(dout[off + c]);
        dw[c - c0] += dy * ((load<A>(inp[off + c]) - m) * s);
        db[c - c0] += dy;
      }
    }
    for (int c = c0; c < c1; ++c) {
      if (dweight != nullptr) dweight[c] = store<G>(load<A>(dweight[c]) + dw[c - c0]);
      if (dbias != nullptr) dbias[c] = store<G>(load<A>(dbias[c]) + db[c - c0]);
    }
  }
}

#define ZRT_FWD(S)                                                                                \
  template void layernorm_forward<S>(S*, acc_t<S>*, acc_t<S>*, const S*, const S*, const S*, int, \
                                     int);
#define ZRT_BWD(S, G)                                                              \
  template void layernorm_backward<S, G>(S*, G*, G*, const S*, const S*, const S*, \
                                         const acc_t<S>*, const acc_t<S>*, int, int);
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
