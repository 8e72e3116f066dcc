#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <type_traits>

#include "kernels/cpu/gemm.h"

namespace zrt::kernels::cpu {

namespace {
constexpr int kMatmulChannelBlock = 64;
using I64 = std::int64_t;
}  // namespace

template <typename S>
std::int64_t matmul_forward_workspace(int N, int C, int OC) {
  if constexpr (!kIs16Bit<S>) return 0;
  return I64{N} * C + I64{C} * OC + I64{N} * OC;
}

template <typename S>
std::int64_t matmul_backward_workspace(int N, int C, int OC) {
  if constexpr (!kIs16Bit<S>) return 0;
  return I64{N} * OC + I64{N} * C + I64{C} * OC + std::max(I64{N} * C, I64{C} * OC);
}

template <typename S, typename G>
void bias_backward(G* dbias, const S* dout, int N, int C) {
  using A = acc_t<S>;
  const int blocks = (C + kMatmulChannelBlock - 1) / kMatmulChannelBlock;
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < blocks; ++blk) {
    const int c0 = blk * kMatmulChannelBlock;
    const int c1 = std::min(C, c0 + kMatmulChannelBlock);
    A sum[kMatmulChannelBlock] = {};
    for (int n = 0; n < N; ++n) {
      const S* row = dout + I64{n} * C;
      for (int c = c0; c < c1; ++c) sum[c - c0] += load<A>(row[c]);
    }
    for (int c = c0; c < c1; ++c) dbias[c] = store<G>(load<A>(dbias[c]) + sum[c - c0]);
  }
}

template <typename S>
void dense_forward(S* out, const S* inp, const S* weight, const S* bias, int N, int C, int OC,
                   acc_t<S>* ws, WeightLayout layout) {
  using A = acc_t<S>;
  const bool out_in = layout == WeightLayout::kOutIn;
  const int ldw = out_in ? C : OC;
  if constexpr (!kIs16Bit<S>) {
    (void)ws;
    gemm<A>(false, out_in, N, OC, C, A(1), inp, C, weight, ldw, A(0), out, OC);
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
    A* fout = fw + I64{C} * OC;
    convert_to_acc(finp, inp, I64{N} * C);
    convert_to_acc(fw, weight, I64{C} * OC);
    gemm<A>(false, out_in, N, OC, C, A(1), finp, C, fw, ldw, A(0), fout, OC);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; ++n) {
      const A* f = fout + I64{n} * OC;
      S* o = out + I64{n} * OC;
      for (int c = 0; c < OC; ++c) o[c] = store<S>(bias ? f[c] + load<A>(bias[c]) : f[c]);
    }
  }
}

template <typename S, typename G>
void dense_backward(S* dinp, G* dweight, G* dbias, const S* dout, const S* inp, const S* weight,
                    int N, int C, int OC, acc_t<S>* ws, WeightLayout layout, GradWrite dinp_write) {
  using A = acc_t<S>;
  const bool out_in = layout == WeightLayout::kOutIn;
  const bool overwrite = dinp_write == GradWrite::kOverwrite;
  const int ldw = out_in ? C : OC;
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
    tmp = fw + I64{C} * OC;
    convert_to_acc(fdout, dout, I64{N} * OC);
    convert_to_acc(finp, inp, I64{N} * C);
    convert_to_acc(fw, weight, I64{C} * OC);
    a_dout = fdout;
    a_inp = finp;
    a_w = fw;
  }
  if (dinp != nullptr) {
    // dinp (N,C) += dout (N,OC) @ W as (OC,C): W itself when stored (out, in), else W^T.
    if constexpr (std::is_same_v<S, A>) {
      gemm<A>(false, !out_in, N, C, OC, A(1), a_dout, OC, a_w, ldw, A(overwrite ? 0 : 1), dinp, C);
    } else {
      gemm<A>(false, !out_in, N, C, OC, A(1), a_dout, OC, a_w, ldw, A(0), tmp, C);
      if (overwrite) {
        convert_from_acc(dinp, tmp, I64{N} * C);
      } else {
        accumulate_from_acc(dinp, tmp, I64{N} * C);
      }
    }
  }
  // dweight in its own layout: dout^T @ inp (OC,C), or inp^T @ dout (C,OC); none for a
  // weight that is not trained (null: the GEMM is skipped, the bias still gets its sums).
  if (dweight != nullptr) {
    const A* first = out_in ? a_dout : a_inp;
    const A* second = out_in ? a_inp : a_dout;
    const int rows = out_in ? OC : C, cols = out_in ? C : OC;
    if constexpr (std::is_same_v<G, A>) {
      gemm<A>(true, false, rows, cols, N, A(1), first, rows, second, cols, A(1), dweight, cols);
    } else {
      gemm<A>(true, false, rows, cols, N, A(1), first, rows, second, cols, A(0), tmp, cols);
      accumulate_from_acc(dweight, tmp, I64{C} * OC);
    }
  }
  if (dbias != nullptr) bias_backward<S, G>(dbias, dout, N, OC);
}

template <typename S>
void matmul_forward(S* out, const S* inp, const S* weight, const S* bias, int N, int C, int OC,
                    acc_t<S>* ws) {
  dense_forward<S>(out, inp, weight, bias, N, C, OC, ws, WeightLayout::kInOut);
}

template <typename S, typename G>
void matmul_backward(S* dinp, G* dweight, G* dbias, const S* dout, const S* inp, const S* weight,
                     int N, int C, int OC, acc_t<S>* ws, GradWrite dinp_write) {
  dense_backward<S, G>(dinp, dweight, dbias, dout, inp, weight, N, C, OC, ws, WeightLayout::kInOut,
                       dinp_write);
}

#define ZRT_FWD(S)                                                                             \
  template std::int64_t matmul_forward_workspace<S>(int, int, int);                            \
  template std::int64_t matmul_backward_workspace<S>(int, int, int);                           \
  template void matmul_forward<S>(S*, const S*, const S*, const S*, int, int, int, acc_t<S>*); \
  template void dense_forward<S>(S*, const S*, const S*, const S*, int, int, int, acc_t<S>*,   \
                                 WeightLayout);
#define ZRT_BWD(S, G)                                                                          \
  template void matmul_backward<S, G>(S*, G*, G*, const S*, const S*, const S*, int, int, int, \
                                      acc_t<S>*, GradWrite);                                   \
  template void dense_backward<S, G>(S*, G*, G*, const S*, const S*, const S*, int, int, int,  \
                                     acc_t<S>*, WeightLayout, GradWrite);                      \
  template void bias_backward<S, G>(G*, const S*, int, int);
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
