#include "kernels/cpu/crossentropy.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/vec_math.h"
#include "runtime/common/error.h"

namespace zrt::kernels::cpu {

namespace {
using I64 = std::int64_t;

// Targets below 0 are rows left out of the loss; the rest must be token ids.
void check_targets(const std::int32_t* targets, int N, int V) {
  for (int n = 0; n < N; ++n) {
    if (targets[n] >= V) {
      ZRT_THROW(InvalidArgument, "target id {} at position {} is outside the vocabulary [0, {})",
                targets[n], n, V);
    }
  }
}

int row_stride(int V, int ldl) {
  ZRT_CHECK(ldl == 0 || ldl >= V, "logits row stride {} is below the vocabulary size {}", ldl, V);
  return ldl == 0 ? V : ldl;
}

// The row as fp32: itself for float storage, else converted into `buffer`.
template <typename S>
const float* fp32_row(const S* row, int V, std::vector<float>& buffer) {
  if constexpr (std::is_same_v<S, float>) {
    (void)V;
    (void)buffer;
    return row;
  } else {
    for (int v = 0; v < V; ++v) buffer[v] = load<float>(row[v]);
    return buffer.data();
  }
}

// Returns (max, sum of exp(x - max)) of one row (double precision path).
template <typename A, typename S>
std::pair<A, A> softmax_stats(const S* row, int V) {
  A mx = load<A>(row[0]);
  for (int v = 1; v < V; ++v) mx = std::max(mx, load<A>(row[v]));
  A sum = 0;
  for (int v = 0; v < V; ++v) sum += std::exp(load<A>(row[v]) - mx);
  return {mx, sum};
}
}  // namespace

template <typename S>
std::int64_t logits_forward_workspace(int N, int C, int V, int ldl) {
  if constexpr (!kIs16Bit<S>) return 0;
  return I64{N} * C + I64{V} * C + I64{N} * row_stride(V, ldl);
}

template <typename S>
std::int64_t logits_backward_workspace(int N, int C, int V, int ldl) {
  if constexpr (!kIs16Bit<S>) return 0;
  return I64{N} * row_stride(V, ldl) + I64{N} * C + I64{V} * C + std::max(I64{N} * C, I64{V} * C);
}

template <typename S>
void logits_forward(S* logits, const S* inp, const S* wte, int N, int C, int V, acc_t<S>* ws,
                    int ldl) {
  using A = acc_t<S>;
  ldl = row_stride(V, ldl);
  if constexpr (!kIs16Bit<S>) {
    (void)ws;
    gemm<A>(false, true, N, V, C, A(1), inp, C, wte, C, A(0), logits, ldl);
  } else {
    A* finp = ws;
    A* fw = finp + I64{N} * C;
    A* fout = fw + I64{V} * C;
    convert_to_acc(finp, inp, I64{N} * C);
    convert_to_acc(fw, wte, I64{V} * C);
    gemm<A>(false, true, N, V, C, A(1), finp, C, fw, C, A(0), fout, ldl);
    convert_from_acc(logits, fout, I64{N} * ldl);  // the padding carries scratch, never read
  }
}

template <typename S, typename G>
void logits_backward(S* dinp, G* dwte, const S* dlogits, const S* inp, const S* wte, int N, int C,
                     int V, acc_t<S>* ws, int ldl) {
  using A = acc_t<S>;
  ldl = row_stride(V, ldl);
  const A* a_dl;
  const A* a_inp;
  const A* a_w;
  A* tmp = nullptr;
  if constexpr (!kIs16Bit<S>) {
    (void)ws;
    a_dl = dlogits;
    a_inp = inp;
    a_w = wte;
  } else {
    A* fdl = ws;
    A* finp = fdl + I64{N} * ldl;
    A* fw = finp + I64{N} * C;
    tmp = fw + I64{V} * C;
    convert_to_acc(fdl, dlogits, I64{N} * ldl);
    convert_to_acc(finp, inp, I64{N} * C);
    convert_to_acc(fw, wte, I64{V} * C);
    a_dl = fdl;
    a_inp = finp;
    a_w = fw;
  }
  if constexpr (std::is_same_v<S, A>) {
    gemm<A>(false, false, N, C, V, A(1), a_dl, ldl, a_w, C, A(1), dinp, C);
  } else {
    gemm<A>(false, false, N, C, V, A(1), a_dl, ldl, a_w, C, A(0), tmp, C);
    accumulate_from_acc(dinp, tmp, I64{N} * C);
  }
  if (dwte == nullptr) return;  // a head that is not trained
  if constexpr (std::is_same_v<G, A>) {
    gemm<A>(true, false, V, C, N, A(1), a_dl, ldl, a_inp, C, A(1), dwte, C);
  } else {
    gemm<A>(true, false, V, C, N, A(1), a_dl, ldl, a_inp, C, A(0), tmp, C);
    accumulate_from_acc(dwte, tmp, I64{V} * C);
  }
}

template <typename S>
void crossentropy_forward(acc_t<S>* losses, const S* logits, const std::int32_t* targets, int N,
                          int V, int ldl) {
  using A = acc_t<S>;
  ldl = row_stride(V, ldl);
  check_targets(targets, N, V);
#pragma omp parallel
  {
    std::vector<float> buffer(kIs16Bit<S> ? V : 0);
#pragma omp for schedule(static)
    for (int n = 0; n < N; ++n) {
      const S* row = logits + I64{n} * ldl;
      if (targets[n] < 0) {  // not in the loss
        losses[n] = A(0);
        continue;
      }
      if constexpr (std::is_same_v<A, float>) {
        const float* x = fp32_row(row, V, buffer);
        const float mx = span_max(x, V);
        losses[n] = std::log(span_sum_exp(x, V, mx)) + mx - x[targets[n]];
      } else {
        const auto [mx, sum] = softmax_stats<A>(row, V);
        losses[n] = std::log(sum) + mx - load<A>(row[targets[n]]);
      }
    }
  }
}

template <typename S>
void crossentropy_forward_backward(acc_t<S>* losses, S* dlogits, const S* logits,
                                   const std::int32_t* targets, acc_t<S> dloss, int N, int V,
                                   int ldl) {
  using A = acc_t<S>;
  ldl = row_stride(V, ldl);
  check_targets(targets, N, V);
#pragma omp parallel
  {
    std::vector<float> buffer(kIs16Bit<S> ? V : 0);
#pragma omp for schedule(static)
    for (int n = 0; n < N; ++n) {
      const S* row = logits + I64{n} * ldl;
      S* drow = dlogits + I64{n} * ldl;
      const int target = targets[n];
      if (target < 0) {  // not in the loss: no loss, no gradient
        if (losses != nullptr) losses[n] = A(0);
        for (int v = 0; v < ldl; ++v) drow[v] = store<S>(A(0));
        continue;
      }
      // Each loss is crossentropy_forward's expression on the same statistics, taken before
      // the row is overwritten (dlogits may alias logits).
      if constexpr (std::is_same_v<A, float>) {
        const float* x = fp32_row(row, V, buffer);
        const float mx = span_max(x, V);
        const float sum = span_sum_exp(x, V, mx);
        if (losses != nullptr) losses[n] = std::log(sum) + mx - x[target];
        const float inv = 1.0f / sum;
        const float p_target = exp_approx(x[target] - mx) * inv;
        if constexpr (std::is_same_v<S, float>) {
          span_exp_scale_to(drow, x, V, mx, inv * dloss);
          drow[target] = (p_target - 1.0f) * dloss;
        } else {
          float* d = buffer.data();  // in place over the converted row
          span_exp_scale_to(d, x, V, mx, inv * dloss);
          d[target] = (p_target - 1.0f) * dloss;
          for (int v = 0; v < V; ++v) drow[v] = store<S>(d[v]);
        }
      } else {
        const auto [mx, sum] = softmax_stats<A>(row, V);
        if (losses != nullptr) losses[n] = std::log(sum) + mx - load<A>(row[target]);
        const A inv = A(1) / sum;
        for (int v = 0; v < V; ++v) {
          const A p = std::exp(load<A>(row[v]) - mx) * inv;
          drow[v] = store<S>((p - (v == target ? A(1) : A(0))) * dloss);
        }
      }
      for (int v = V; v < ldl; ++v) drow[v] = store<S>(A(0));
    }
  }
}

template <typename S>
void crossentropy_backward(S* dlogits, const S* logits, const std::int32_t* targets, acc_t<S> dloss,
                           int N, int V, int ldl) {
  crossentropy_forward_backward<S>(nullptr, dlogits, logits, targets, dloss, N, V, ldl);
}

template <typename A>
void loss_mean(A* out, const A* losses, int N, float divisor) {
  double sum = 0;
  for (int n = 0; n < N; ++n) sum += static_cast<double>(losses[n]);
  const double denominator = divisor > 0.0f ? static_cast<double>(divisor) : N;
  out[0] = static_cast<A>(sum / denominator);
}

#define ZRT_FWD(S)                                                                                \
  template std::int64_t logits_forward_workspace<S>(int, int, int, int);                          \
  template std::int64_t logits_backward_workspace<S>(int, int, int, int);                         \
  template void logits_forward<S>(S*, const S*, const S*, int, int, int, acc_t<S>*, int);         \
  template void crossentropy_forward<S>(acc_t<S>*, const S*, const std::int32_t*, int, int, int); \
  template void crossentropy_backward<S>(S*, const S*, const std::int32_t*, acc_t<S>, int, int,   \
                                         int);                                                    \
  template void crossentropy_forward_backward<S>(acc_t<S>*, S*, const S*, const std::int32_t*,    \
                                                 acc_t<S>, int, int, int);
#define ZRT_BWD(S, G)                                                                      \
  template void logits_backward<S, G>(S*, G*, const S*, const S*, const S*, int, int, int, \
                                      acc_t<S>*, int);
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
template void loss_mean<float>(float*, const float*, int, float);
template void loss_mean<double>(double*, const double*, int, float);
#undef ZRT_FWD
#undef ZRT_BWD

}  // namespace zrt::kernels::cpu
