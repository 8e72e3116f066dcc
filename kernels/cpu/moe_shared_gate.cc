#include "kernels/cpu/moe_shared_gate.h"

#include <cmath>

namespace zrt::kernels::cpu {

namespace {
using I64 = std::int64_t;

template <typename A>
A sigmoid(A x) {
  return A(1) / (A(1) + std::exp(-x));
}
}  // namespace

template <typename S>
void moe_shared_gate_forward(S* out, const S* s, const S* g, int N, int C) {
  using A = acc_t<S>;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const A gate = sigmoid(load<A>(g[n]));
    S* o = out + I64{n} * C;
    const S* sn = s + I64{n} * C;
    for (int c = 0; c < C; ++c) o[c] = store<S>(load<A>(o[c]) + gate * load<A>(sn[c]));
  }
}

template <typename S>
void moe_shared_gate_backward(S* ds, S* dg, const S* dout, const S* s, const S* g, int N, int C) {
  using A = acc_t<S>;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const A gate = sigmoid(load<A>(g[n]));
    const S* d = dout + I64{n} * C;
    const S* sn = s + I64{n} * C;
    S* dsn = ds + I64{n} * C;
    A dot = 0;
    for (int c = 0; c < C; ++c) {
      const A dc = load<A>(d[c]);
      dot += dc * load<A>(sn[c]);
      dsn[c] = store<S>(gate * dc);
    }
    dg[n] = store<S>(gate * (A(1) - gate) * dot);
  }
}

#define ZRT_INSTANTIATE(S)                                                    \
  template void moe_shared_gate_forward<S>(S*, const S*, const S*, int, int); \
  template void moe_shared_gate_backward<S>(S*, S*, const S*, const S*, const S*, int, int);
ZRT_INSTANTIATE(float)
ZRT_INSTANTIATE(double)
ZRT_INSTANTIATE(bf16)
ZRT_INSTANTIATE(fp16)
#undef ZRT_INSTANTIATE

}  // namespace zrt::kernels::cpu
