#include "kernels/cpu/linear.h"

#include <algorithm>
#include <type_traits>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/matmul.h"

namespace zrt::kernels::cpu {

namespace {
using I64 = std::int64_t;
}  // namespace

template <typename S>
std::int64_t linear_forward_workspace(int N, int C, int OC) {
  if constexpr (!kIs16Bit<S>) return 0;
  return I64{N} * C + I64{OC} * C + I64{N} * OC;
}

template <typename S>
std::int64_t linear_backward_workspace(int N, int C, int OC) {
  if constexpr (!kIs16Bit<S>) return 0;
  return I64{N} * OC + I64{N} * C + I64{OC} * C + std::max(I64{N} * C, I64{OC} * C);
}

template <typename S>
void linear_forward(S* out, const S* inp, const S* weight, const S* bias, int N, int C, int OC,
                    acc_t<S>* ws) {
  using A = acc_t<S>;
  if constexpr (!kIs16Bit<S>) {
    (void)ws;
    gemm<A>(false, true, N, OC, C, A(1), inp, C, weight, C, A(0), out, OC);
    if (bias != nullptr) {
#pragma omp parallel for schedule(static)
      for (int n = 0; n < N; ++n) {
        S* o = out + I64{n} * OC;
        for (int c = 0; c < OC; ++c) o[c] += bias[c];
      }
    }
  } else {
    A* finp = ws;
    A* fw = finp + I64{N} * C;
    A* fout = fw + I64{OC} * C;
    convert_to_acc(finp, inp, I64{N} * C);
    convert_to_acc(fw, weight, I64{OC} * C);
    gemm<A>(false, true, N, OC, C, A(1), finp, C, fw, C, A(0), fout, OC);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; ++n) {
      const A* f = fout + I64{n} * OC;
      S* o = out + I64{n} * OC;
      for (int c = 0; c < OC; ++c) o[c] = store<S>(bias ? f[c] + load<A>(bias[c]) : f[c]);
    }
  }
}

template <typename S, typename G>
void linear_backward(S* dinp, G* dweight, G* dbias, const S* dout, const S* inp, const S* weight,
                     int N, int C, int OC, acc_t<S>* ws) {
  using A = acc_t<S>;
  const A* a_dout;
  const A* a_inp;
  const A* a_w;
  A* tmp = nullptr;
  if constexpr (!kIs16Bit<S>) {
    (void)ws;
    a_dout = dout;
    a_inp = inp;
    a_w = weight;
  } else {
    A* fdout = ws;
    A* finp = fdout + I64{N} * OC;
    A* fw = finp + I64{N} * C;
    tmp = fw + I64{OC} * C;
    convert_to_acc(fdout, dout, I64{N} * OC);
    convert_to_acc(finp, inp, I64{N} * C);
    convert_to_acc(fw, weight, I64{OC} * C);
    a_dout = fdout;
    a_inp = finp;
    a_w = fw;
  }
  if (dinp != nullptr) {
    if constexpr (std::is_same_v<S, A>) {
      gemm<A>(false, false, N, C, OC, A(1), a_dout, OC, a_w, C, A(1), dinp, C);
    } else {
      gemm<A>(false, false, N, C, OC, A(1), a_dout, OC, a_w, C, A(0), tmp, C);
      accumulate_from_acc(dinp, tmp, I64{N} * C);
    }
  }
  if constexpr (std::is_same_v<G, A>) {
    gemm<A>(true, false, OC, C, N, A(1), a_dout, OC, a_inp, C, A(1), dweight, C);
  } else {
    gemm<A>(true, false, OC, C, N, A(1), a_dout, OC, a_inp, C, A(0), tmp, C);
    accumulate_from_acc(dweight, tmp, I64{OC} * C);
  }
  if (dbias != nullptr) bias_backward<S, G>(dbias, dout, N, OC);
}

#define ZRT_FWD(S)                                                   \
  template std::int64_t linear_forward_workspace<S>(int, int, int);  \
  template std::int64_t linear_backward_workspace<S>(int, int, int); \
  template void linear_forward<S>(S*, const S*, const S*, const S*, int, int, int, acc_t<S>*);
#define ZRT_BWD(S, G)                                                                          \
  template void linear_backward<S, G>(S*, G*, G*, const S*, const S*, const S*, int, int, int, \
                                      acc_t<S>*);
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
