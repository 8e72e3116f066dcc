// The row passes of causal attention's softmax, shared by the CPU twins of multi-head
// (attention.cc) and grouped-query (gqa_attention.cc) attention. A row t of T scores keeps its
// span [lo, t] (the keys a query at t may see: lo > 0 under a sliding window, documents.h) and is
// zero outside it. fp32 rows use the
// vectorized span functions of vec_math.h; double rows (finite-difference checks) plain loops.
#pragma once

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/cpu/vec_math.h"

namespace zrt::kernels::cpu {

// row[lo..t] <- softmax(row[lo..t]); the rest of row[0..T) <- 0. Returns the row's log-sum-exp,
// log(sum_{lo<=u<=t} exp(row[u])) of the scores it was given (attention's kept statistic).
template <typename A>
A causal_softmax_row(A* row, int lo, int t, int T) {
  std::fill(row, row + lo, A(0));
  row += lo;
  t -= lo;
  T -= lo;
  A lse;
  if constexpr (std::is_same_v<A, float>) {
    const float mx = span_max(row, t + 1);
    span_exp_scale(row, t + 1, mx, 1.0f);
    const float sum = span_sum(row, t + 1);
    span_scale(row, t + 1, 1.0f / sum);
    lse = mx + std::log(sum);
  } else {
    A mx = row[0];
    for (int u = 1; u <= t; ++u) mx = std::max(mx, row[u]);
    A sum = 0;
    for (int u = 0; u <= t; ++u) {
      row[u] = std::exp(row[u] - mx);
      sum += row[u];
    }
    const A inv = A(1) / sum;
    for (int u = 0; u <= t; ++u) row[u] *= inv;
    lse = mx + std::log(sum);
  }
  for (int u = t + 1; u < T; ++u) row[u] = A(0);
  return lse;
}

// row[lo..t] <- exp(row[lo..t] - lse): the probabilities again from the scores and the forward's
// log-sum-exp (the backward's recomputation); the rest of row[0..T) <- 0.
template <typename A>
void causal_probs_row(A* row, A lse, int lo, int t, int T) {
  std::fill(row, row + lo, A(0));
  row += lo;
  t -= lo;
  T -= lo;
  if constexpr (std::is_same_v<A, float>) {
    span_exp_scale(row, t + 1, lse, 1.0f);
  } else {
    for (int u = 0; u <= t; ++u) row[u] = std::exp(row[u] - lse);
  }
  for (int u = t + 1; u < T; ++u) row[u] = A(0);
}

}  // namespace zrt::kernels::cpu
