#include "kernels/cpu/rope.h"

#include <cmath>
#include <cstdint>

#include "runtime/common/error.h"

namespace zrt::kernels::cpu {

namespace {

// Rotates every head of row (b,t) by +angle (sign 1) or -angle (sign -1).
template <typename S>
void rotate(S* out, const S* inp, const RopeTable& table, int B, int T, int NH, int hs, int sign,
            const std::int32_t* positions) {
  using A = acc_t<S>;
  ZRT_CHECK(hs == 2 * table.pairs, "rope: head size {} but a table of {} pairs", hs, table.pairs);
  const int P = table.pairs;
#pragma omp parallel for schedule(static)
  for (int row = 0; row < B * T; ++row) {
    const int t = positions != nullptr ? positions[row] : row % T;
    A cs[kRopeMaxPairs], sn[kRopeMaxPairs];
    const double scale = table.attention_scaling;  // yarn's; 1 otherwise
    for (int i = 0; i < P; ++i) {
      const double angle = static_cast<double>(t) * static_cast<double>(table.inv_freq[i]);
      cs[i] = static_cast<A>(scale * std::cos(angle));
      sn[i] = static_cast<A>(sign * scale * std::sin(angle));
    }
    for (int h = 0; h < NH; ++h) {
      const std::int64_t off = (static_cast<std::int64_t>(row) * NH + h) * hs;
      const S* x = inp + off;
      S* o = out + off;
      for (int i = 0; i < P; ++i) {
        const A x1 = load<A>(x[i]);
        const A x2 = load<A>(x[i + P]);
        o[i] = store<S>(x1 * cs[i] - x2 * sn[i]);
        o[i + P] = store<S>(x2 * cs[i] + x1 * sn[i]);
      }
    }
  }
}

}  // namespace

template <typename S>
void rope_forward(S* out, const S* inp, const RopeTable& table, int B, int T, int NH, int hs,
                  const std::int32_t* positions) {
  rotate(out, inp, table, B, T, NH, hs, 1, positions);
}

template <typename S>
void rope_backward(S* dinp, const S* dout, const RopeTable& table, int B, int T, int NH, int hs,
                   const std::int32_t* positions) {
  rotate(dinp, dout, table, B, T, NH, hs, -1, positions);
}

#define ZRT_INSTANTIATE(S)                                                           \
  template void rope_forward<S>(S*, const S*, const RopeTable&, int, int, int, int,  \
                                const std::int32_t*);                                \
  template void rope_backward<S>(S*, const S*, const RopeTable&, int, int, int, int, \
                                 const std::int32_t*);
ZRT_INSTANTIATE(float)
ZRT_INSTANTIATE(double)
ZRT_INSTANTIATE(bf16)
ZRT_INSTANTIATE(fp16)
#undef ZRT_INSTANTIATE

}  // namespace zrt::kernels::cpu
