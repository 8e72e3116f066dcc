#include "kernels/cpu/gqa_attention.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/cpu/causal_softmax.h"
#include "kernels/cpu/gemm.h"
#include "runtime/common/error.h"

namespace zrt::kernels::cpu {

namespace {
using I64 = std::int64_t;

constexpr int kTaskGroup = 32;  // (b, kv head) tasks whose datt scratch is live at once

int task_group(int B, int NKV) {
  return std::min(kTaskGroup, B * NKV);
}

void check_heads(int NH, int NKV, int hs) {
  ZRT_CHECK(NH > 0 && NKV > 0 && NH % NKV == 0 && hs > 0,
            "gqa attention: NH={} must be a positive multiple of NKV={} (hs={})", NH, NKV, hs);
}

}  // namespace

template <typename S>
std::int64_t gqa_attention_forward_workspace(int B, int T, int NH, int NKV, int hs) {
  if constexpr (!kIs16Bit<S>) return 0;
  return I64{B} * T * hs * (2 * NH + 2 * NKV);
}

template <typename S>
std::int64_t gqa_attention_backward_workspace(int B, int T, int NH, int NKV, int hs) {
  const I64 datt = I64{task_group(B, NKV)} * T * T;
  if constexpr (!kIs16Bit<S>) return datt;
  return datt + 2 * I64{B} * T * hs * (2 * NH + 2 * NKV);
}

template <typename S>
void gqa_attention_forward(S* out, acc_t<S>* att, const S* q, const S* k, const S* v, int B, int T,
                           int NH, int NKV, int hs, acc_t<S>* ws) {
  using A = acc_t<S>;
  check_heads(NH, NKV, hs);
  const A scale = A(1) / std::sqrt(static_cast<A>(hs));
  const int QC = NH * hs, KC = NKV * hs, group = NH / NKV;
  const A *aq, *ak, *av;
  A* aout;
  if constexpr (!kIs16Bit<S>) {
    (void)ws;
    aq = q;
    ak = k;
    av = v;
    aout = out;
  } else {
    A* fq = ws;
    A* fk = fq + I64{B} * T * QC;
    A* fv = fk + I64{B} * T * KC;
    aout = fv + I64{B} * T * KC;
    convert_to_acc(fq, q, I64{B} * T * QC);
    convert_to_acc(fk, k, I64{B} * T * KC);
    convert_to_acc(fv, v, I64{B} * T * KC);
    aq = fq;
    ak = fk;
    av = fv;
  }
#pragma omp parallel for schedule(dynamic, 1)
  for (int p = 0; p < B * NKV; ++p) {
    const int b = p / NKV;
    const int kh = p % NKV;
    const A* kp = ak + I64{b} * T * KC + I64{kh} * hs;
    const A* vp = av + I64{b} * T * KC + I64{kh} * hs;
    for (int h = kh * group; h < (kh + 1) * group; ++h) {
      const A* qp = aq + I64{b} * T * QC + I64{h} * hs;
      A* a = att + (I64{b} * NH + h) * T * T;
      gemm_serial<A>(false, true, T, T, hs, scale, qp, QC, kp, KC, A(0), a, T);
      for (int t = 0; t < T; ++t) causal_softmax_row(a + I64{t} * T, t, T);
      gemm_serial<A>(false, false, T, hs, T, A(1), a, T, vp, KC, A(0),
                     aout + I64{b} * T * QC + I64{h} * hs, QC);
    }
  }
  if constexpr (kIs16Bit<S>) convert_from_acc(out, aout, I64{B} * T * QC);
}

template <typename S>
void gqa_attention_backward(S* dq, S* dk, S* dv, const S* dout, const S* q, const S* k, const S* v,
                            const acc_t<S>* att, int B, int T, int NH, int NKV, int hs,
                            acc_t<S>* ws) {
  using A = acc_t<S>;
  check_heads(NH, NKV, hs);
  const A scale = A(1) / std::sqrt(static_cast<A>(hs));
  const int QC = NH * hs, KC = NKV * hs, group = NH / NKV;
  const int tasks = task_group(B, NKV);
  A* datt_ws = ws;
  const A *aq, *ak, *av, *adout;
  A *adq, *adk, *adv;
  if constexpr (!kIs16Bit<S>) {
    aq = q;
    ak = k;
    av = v;
    adout = dout;
    adq = dq;
    adk = dk;
    adv = dv;
  } else {
    const I64 nq = I64{B} * T * QC, nk = I64{B} * T * KC;
    A* f = ws + I64{tasks} * T * T;
    A* fq = f;
    A* fk = fq + nq;
    A* fv = fk + nk;
    A* fdout = fv + nk;
    adq = fdout + nq;
    adk = adq + nq;
    adv = adk + nk;
    convert_to_acc(fq, q, nq);
    convert_to_acc(fk, k, nk);
    convert_to_acc(fv, v, nk);
    convert_to_acc(fdout, dout, nq);
    std::fill(adq, adq + nq + 2 * nk, A(0));
    aq = fq;
    ak = fk;
    av = fv;
    adout = fdout;
  }
  for (int p0 = 0; p0 < B * NKV; p0 += tasks) {
    const int p1 = std::min(B * NKV, p0 + tasks);
#pragma omp parallel for schedule(dynamic, 1)
    for (int p = p0; p < p1; ++p) {
      const int b = p / NKV;
      const int kh = p % NKV;
      const I64 koff = I64{b} * T * KC + I64{kh} * hs;
      const A* kp = ak + koff;
      const A* vp = av + koff;
      A* dkp = adk + koff;
      A* dvp = adv + koff;
      A* da = datt_ws + I64{p - p0} * T * T;
      for (int h = kh * group; h < (kh + 1) * group; ++h) {
        const I64 qoff = I64{b} * T * QC + I64{h} * hs;
        const A* qp = aq + qoff;
        A* dqp = adq + qoff;
        const A* dy = adout + qoff;
        const A* a = att + (I64{b} * NH + h) * T * T;
        gemm_serial<A>(false, true, T, T, hs, A(1), dy, QC, vp, KC, A(0), da, T);
        gemm_serial<A>(true, false, T, hs, T, A(1), a, T, dy, QC, A(1), dvp, KC);
        for (int t = 0; t < T; ++t) causal_softmax_grad_row(da + I64{t} * T, a + I64{t} * T, t, T);
        gemm_serial<A>(false, false, T, hs, T, scale, da, T, kp, KC, A(1), dqp, QC);
        gemm_serial<A>(true, false, T, hs, T, scale, da, T, qp, QC, A(1), dkp, KC);
      }
    }
  }
  if constexpr (kIs16Bit<S>) {
    accumulate_from_acc(dq, adq, I64{B} * T * QC);
    accumulate_from_acc(dk, adk, I64{B} * T * KC);
    accumulate_from_acc(dv, adv, I64{B} * T * KC);
  }
}

#define ZRT_INSTANTIATE(S)                                                                      \
  template std::int64_t gqa_attention_forward_workspace<S>(int, int, int, int, int);            \
  template std::int64_t gqa_attention_backward_workspace<S>(int, int, int, int, int);           \
  template void gqa_attention_forward<S>(S*, acc_t<S>*, const S*, const S*, const S*, int, int, \
                                         int, int, int, acc_t<S>*);                             \
  template void gqa_attention_backward<S>(S*, S*, S*, const S*, const S*, const S*, const S*,   \
                                          const acc_t<S>*, int, int, int, int, int, acc_t<S>*);
ZRT_INSTANTIATE(float)
ZRT_INSTANTIATE(double)
ZRT_INSTANTIATE(bf16)
ZRT_INSTANTIATE(fp16)
#undef ZRT_INSTANTIATE

}  // namespace zrt::kernels::cpu
