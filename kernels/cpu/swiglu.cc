#include "kernels/cpu/swiglu.h"

#include <cmath>

namespace zrt::kernels::cpu {

template <typename S>
void swiglu_forward(S* out, const S* gate, const S* up, std::int64_t n) {
  using A = acc_t<S>;
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < n; ++i) {
    const A g = load<A>(gate[i]);
    const A sig = A(1) / (A(1) + std::exp(-g));
    out[i] = store<S>(g * sig * load<A>(up[i]));
  }
}

template <typename S>
void swiglu_backward(S* dgate, S* dup, const S* dout, const S* gate, const S* up, std::int64_t n) {
  using A = acc_t<S>;
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < n; ++i) {
    const A g = load<A>(gate[i]);
    const A u = load<A>(up[i]);
    const A dy = load<A>(dout[i]);
    const A sig = A(1) / (A(1) + std::exp(-g));
    dgate[i] = store<S>(load<A>(dgate[i]) + dy * u * sig * (A(1) + g * (A(1) - sig)));
    dup[i] = store<S>(load<A>(dup[i]) + dy * g * sig);
  }
}

#define ZRT_INSTANTIATE(S)                                               \
  template void swiglu_forward<S>(S*, const S*, const S*, std::int64_t); \
  template void swiglu_backward<S>(S*, S*, const S*, const S*, const S*, std::int64_t);
ZRT_INSTANTIATE(float)
ZRT_INSTANTIATE(double)
ZRT_INSTANTIATE(bf16)
ZRT_INSTANTIATE(fp16)
#undef ZRT_INSTANTIATE

}  // namespace zrt::kernels::cpu
