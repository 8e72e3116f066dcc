#include "kernels/cpu/residual.h"

namespace zrt::kernels::cpu {

template <typename S>
void residual_forward(S* out, const S* a, const S* b, std::int64_t n) {
  using A = acc_t<S>;
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < n; ++i) out[i] = store<S>(load<A>(a[i]) + load<A>(b[i]));
}

template <typename S>
void residual_backward(S* da, S* db, const S* dout, std::int64_t n) {
  using A = acc_t<S>;
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < n; ++i) {
    const A d = load<A>(dout[i]);
    da[i] = store<S>(load<A>(da[i]) + d);
    db[i] = store<S>(load<A>(db[i]) + d);
  }
}

#define ZRT_INSTANTIATE(S)                                                 \
  template void residual_forward<S>(S*, const S*, const S*, std::int64_t); \
  template void residual_backward<S>(S*, S*, const S*, std::int64_t);
ZRT_INSTANTIATE(float)
ZRT_INSTANTIATE(double)
ZRT_INSTANTIATE(bf16)
ZRT_INSTANTIATE(fp16)
#undef ZRT_INSTANTIATE

}  // namespace zrt::kernels::cpu
