#include "kernels/cpu/moe_router.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/moe_limits.h"
#include "runtime/common/error.h"

namespace zrt::kernels::cpu {

namespace {
using I64 = std::int64_t;

// The k largest of p[0..E), largest first, the lower index first among equals: each pick is the
// largest element ordered after the previous pick in (value descending, index ascending), so no
// mask of the chosen ones is needed (the CUDA twin does the same, one thread per row).
template <typename A>
void top_k(std::int32_t* idx, A* val, const A* p, int E, int k) {
  A prev_v = std::numeric_limits<A>::infinity();
  int prev_i = -1;
  for (int j = 0; j < k; ++j) {
    int best = -1;
    A best_v = A(0);
    for (int e = 0; e < E; ++e) {
      const A v = p[e];
      const bool after_prev = v < prev_v || (v == prev_v && e > prev_i);
      if (after_prev && (best < 0 || v > best_v)) {
        best = e;
        best_v = v;
      }
    }
    idx[j] = best;
    val[j] = best_v;
    prev_v = best_v;
    prev_i = best;
  }
}

// Softmax of one row into p (acc), returning its log-sum-exp.
template <typename S, typename A = acc_t<S>>
A softmax_row(A* p, const S* logits, int E) {
  A m = -std::numeric_limits<A>::infinity();
  for (int e = 0; e < E; ++e) m = std::max(m, load<A>(logits[e]));
  A sum = 0;
  for (int e = 0; e < E; ++e) {
    p[e] = std::exp(load<A>(logits[e]) - m);
    sum += p[e];
  }
  for (int e = 0; e < E; ++e) p[e] /= sum;
  return m + std::log(sum);
}

}  // namespace

template <typename S>
void moe_router_forward(acc_t<S>* probs, acc_t<S>* weights, std::int32_t* experts, const S* logits,
                        int N, int E, int k, bool renormalize) {
  using A = acc_t<S>;
  ZRT_CHECK(k >= 1 && k <= E && k <= kMoeMaxTopK, "moe router: top-k {} of {} experts (at most {})",
            k, E, kMoeMaxTopK);
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    A* p = probs + I64{n} * E;
    A* w = weights + I64{n} * k;
    softmax_row<S>(p, logits + I64{n} * E, E);
    top_k(experts + I64{n} * k, w, p, E, k);
    if (renormalize) {
      A sum = 0;
      for (int j = 0; j < k; ++j) sum += w[j];
      for (int j = 0; j < k; ++j) w[j] /= sum;
    }
  }
}

template <typename S>
void moe_router_backward(S* dlogits, const acc_t<S>* dweights, const acc_t<S>* probs,
                         const std::int32_t* experts, const acc_t<S>* dprobs_shared, int N, int E,
                         int k, bool renormalize, GradWrite dlogits_write) {
  using A = acc_t<S>;
  const bool overwrite = dlogits_write == GradWrite::kOverwrite;
  ZRT_CHECK(k >= 1 && k <= kMoeMaxTopK, "moe router: top-k {} outside [1, {}]", k, kMoeMaxTopK);
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const A* p = probs + I64{n} * E;
    const std::int32_t* idx = experts + I64{n} * k;
    S* dl = dlogits + I64{n} * E;
    // dv_j, the gradient of the selected (unnormalised) probabilities; at most k of them.
    A dv[kMoeMaxTopK];
    if (dweights == nullptr) {
      for (int j = 0; j < k; ++j) dv[j] = 0;
    } else if (renormalize) {
      A sum = 0;
      for (int j = 0; j < k; ++j) sum += p[idx[j]];
      A dot = 0;
      for (int j = 0; j < k; ++j) dot += dweights[I64{n} * k + j] * (p[idx[j]] / sum);
      for (int j = 0; j < k; ++j) dv[j] = (dweights[I64{n} * k + j] - dot) / sum;
    } else {
      for (int j = 0; j < k; ++j) dv[j] = dweights[I64{n} * k + j];
    }
    auto dprob = [&](int e) {
      A d = dprobs_shared != nullptr ? dprobs_shared[e] : A(0);
      for (int j = 0; j < k; ++j) {
        if (idx[j] == e) d += dv[j];
      }
      return d;
    };
    A dot = 0;
    for (int e = 0; e < E; ++e) dot += p[e] * dprob(e);
    for (int e = 0; e < E; ++e) {
      const A g = p[e] * (dprob(e) - dot);
      dl[e] = store<S>(overwrite ? g : load<A>(dl[e]) + g);
    }
  }
}

template <typename A>
void moe_aux_stats_accumulate(A* counts, A* probsum, const A* probs, const std::int32_t* experts,
                              int N, int E, int k) {
#pragma omp parallel for schedule(static)
  for (int e = 0; e < E; ++e) {
    I64 count = 0;
    A sum = 0;
    for (int n = 0; n < N; ++n) {
      sum += probs[I64{n} * E + e];
      for (int j = 0; j < k; ++j) count += experts[I64{n} * k + j] == e;
    }
    counts[e] += static_cast<A>(count);
    probsum[e] += sum;
  }
}

template <typename A>
void moe_load_balancing_loss(A* loss, const A* counts, const A* probsum, int E,
                             std::int64_t total_rows) {
  const A rows = static_cast<A>(total_rows);
  A sum = 0;
  for (int e = 0; e < E; ++e) sum += (counts[e] / rows) * (probsum[e] / rows);
  loss[0] = sum * static_cast<A>(E);
}

template <typename A>
void moe_add_loss_term(A* loss, const A* term, A coef) {
  loss[0] += coef * term[0];
}

template <typename A>
void moe_load_balancing_loss_backward(A* dprobs_shared, const A* counts, A dloss, int E,
                                      std::int64_t total_rows) {
  const A rows = static_cast<A>(total_rows);
  for (int e = 0; e < E; ++e) {
    dprobs_shared[e] = dloss * static_cast<A>(E) * (counts[e] / rows) / rows;
  }
}

template <typename S>
void moe_router_z_loss_forward(acc_t<S>* loss, const S* logits, int N, int E) {
  using A = acc_t<S>;
  double sum = 0;  // in row order, on one thread: the same bits at any thread count
  for (int n = 0; n < N; ++n) {
    const S* l = logits + I64{n} * E;
    A m = -std::numeric_limits<A>::infinity();
    for (int e = 0; e < E; ++e) m = std::max(m, load<A>(l[e]));
    A s = 0;
    for (int e = 0; e < E; ++e) s += std::exp(load<A>(l[e]) - m);
    const A lse = m + std::log(s);
    sum += static_cast<double>(lse) * static_cast<double>(lse);
  }
  loss[0] = static_cast<A>(N > 0 ? sum / N : 0.0);
}

template <typename S>
void moe_router_z_loss_backward(S* dlogits, const S* logits, acc_t<S> dloss, int N, int E) {
  using A = acc_t<S>;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const S* l = logits + I64{n} * E;
    S* dl = dlogits + I64{n} * E;
    A m = -std::numeric_limits<A>::infinity();
    for (int e = 0; e < E; ++e) m = std::max(m, load<A>(l[e]));
    A s = 0;
    for (int e = 0; e < E; ++e) s += std::exp(load<A>(l[e]) - m);
    const A lse = m + std::log(s);
    const A scale = dloss * A(2) * lse / static_cast<A>(N);
    for (int e = 0; e < E; ++e) {
      const A p = std::exp(load<A>(l[e]) - m) / s;
      dl[e] = store<S>(load<A>(dl[e]) + scale * p);
    }
  }
}

#define ZRT_INSTANTIATE(S)                                                                        \
  template void moe_router_forward<S>(acc_t<S>*, acc_t<S>*, std::int32_t*, const S*, int, int,    \
                                      int, bool);                                                 \
  template void moe_router_backward<S>(S*, const acc_t<S>*, const acc_t<S>*, const std::int32_t*, \
                                       const acc_t<S>*, int, int, int, bool, GradWrite);          \
  template void moe_router_z_loss_forward<S>(acc_t<S>*, const S*, int, int);                      \
  template void moe_router_z_loss_backward<S>(S*, const S*, acc_t<S>, int, int);
ZRT_INSTANTIATE(float)
ZRT_INSTANTIATE(double)
ZRT_INSTANTIATE(bf16)
ZRT_INSTANTIATE(fp16)
#undef ZRT_INSTANTIATE
#define ZRT_INSTANTIATE(A)                                                                         \
  template void moe_aux_stats_accumulate<A>(A*, A*, const A*, const std::int32_t*, int, int, int); \
  template void moe_load_balancing_loss<A>(A*, const A*, const A*, int, std::int64_t);             \
  template void moe_load_balancing_loss_backward<A>(A*, const A*, A, int, std::int64_t);           \
  template void moe_add_loss_term<A>(A*, const A*, A);
ZRT_INSTANTIATE(float)
ZRT_INSTANTIATE(double)
#undef ZRT_INSTANTIATE

}  // namespace zrt::kernels::cpu
