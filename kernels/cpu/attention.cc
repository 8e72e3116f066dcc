#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels/cpu/causal_softmax.h"
#include "kernels/cpu/documents.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/tiled_attention.h"

namespace zrt::kernels::cpu {

namespace {
using I64 = std::int64_t;

int pair_group(int B, int NH) {
  return std::min(kAttentionPairGroup, B * NH);
}

// The documents of every sequence (one span [0, T) each without doc_start).
std::vector<std::vector<DocSpan>> all_spans(const std::int32_t* doc_start, int B, int T) {
  std::vector<std::vector<DocSpan>> docs(B);
  for (int b = 0; b < B; ++b) docs[b] = document_spans(doc_start, b, T);
  return docs;
}

// Elements of acc_t<S> the chosen path's own scratch takes (before the 16-bit conversions).
template <typename S>
I64 attention_scratch(bool backward, int B, int T, int C, int NH, AttentionPath path) {
  using A = acc_t<S>;
  if (path == AttentionPath::kTiled) {
    return backward ? tiled_attention_backward_workspace<A>(B, T, C, NH)
                    : tiled_attention_forward_workspace<A>(B, T, C, NH);
  }
  return (backward ? 2 : 1) * I64{pair_group(B, NH)} * T * T;  // p (and dp)
}

template <typename S>
AttentionPath attention_resolve(AttentionPath path, int B, int T, int NH) {
  return resolve_attention_path(path, B, T, NH, sizeof(acc_t<S>));
}
}  // namespace

template <typename S>
std::int64_t attention_forward_workspace(int B, int T, int C, int NH, AttentionPath path) {
  const I64 scratch =
      attention_scratch<S>(false, B, T, C, NH, attention_resolve<S>(path, B, T, NH));
  if constexpr (!kIs16Bit<S>) return scratch;
  return scratch + I64{B} * T * 3 * C + I64{B} * T * C;
}

template <typename S>
std::int64_t attention_backward_workspace(int B, int T, int C, int NH, AttentionPath path) {
  const I64 scratch = attention_scratch<S>(true, B, T, C, NH, attention_resolve<S>(path, B, T, NH));
  if constexpr (!kIs16Bit<S>) return scratch;
  return scratch + 2 * (I64{B} * T * 3 * C) + 2 * (I64{B} * T * C);
}

namespace {
// Today's kernel on compute-type arrays: per (b,h) pair, each document's L x L scores in
// `scores` (kAttentionPairGroup pairs' worth at a time).
template <typename A>
void full_attention_forward(A* aout, A* lse, const A* aqkv, int B, int T, int C, int NH, A* scores,
                            const std::vector<std::vector<DocSpan>>& docs, int window) {
  const int hs = C / NH;
  const int group = pair_group(B, NH);
  const A scale = A(1) / std::sqrt(static_cast<A>(hs));
  for (int p0 = 0; p0 < B * NH; p0 += group) {
    const int p1 = std::min(B * NH, p0 + group);
#pragma omp parallel for schedule(dynamic, 1)
    for (int p = p0; p < p1; ++p) {
      const int b = p / NH;
      const int h = p % NH;
      A* a = scores + I64{p - p0} * T * T;
      // Each document as a sequence of its own: rows [s, s + L) of q, k, v, scores L x L.
      for (const DocSpan& doc : docs[b]) {
        const int s = doc.begin, L = doc.end - doc.begin;
        const A* q = aqkv + (I64{b} * T + s) * 3 * C + I64{h} * hs;
        const A* k = q + C;
        const A* v = q + 2 * C;
        A* l = lse + I64{p} * T + s;
        gemm_serial<A>(false, true, L, L, hs, scale, q, 3 * C, k, 3 * C, A(0), a, L);
        for (int t = 0; t < L; ++t) {
          l[t] = causal_softmax_row(a + I64{t} * L, first_visible_key(0, t, window), t, L);
        }
        gemm_serial<A>(false, false, L, hs, L, A(1), a, L, v, 3 * C, A(0),
                       aout + (I64{b} * T + s) * C + I64{h} * hs, C);
      }
    }
  }
}

// Today's backward on compute-type arrays; `ws` holds the probabilities and their gradients.
template <typename A>
void full_attention_backward(A* adqkv, const A* adout, const A* aqkv, const A* aout, const A* lse,
                             int B, int T, int C, int NH, A* ws,
                             const std::vector<std::vector<DocSpan>>& docs, int window) {
  const int hs = C / NH;
  const A scale = A(1) / std::sqrt(static_cast<A>(hs));
  const int group = pair_group(B, NH);
  A* probs_ws = ws;
  A* dprobs_ws = ws + I64{group} * T * T;
  for (int p0 = 0; p0 < B * NH; p0 += group) {
    const int p1 = std::min(B * NH, p0 + group);
#pragma omp parallel for schedule(dynamic, 1)
    for (int p = p0; p < p1; ++p) {
      const int b = p / NH;
      const int h = p % NH;
      A* a = probs_ws + I64{p - p0} * T * T;
      A* da = dprobs_ws + I64{p - p0} * T * T;
      for (const DocSpan& doc : docs[b]) {  // each document as a sequence of its own
        const int s = doc.begin, L = doc.end - doc.begin;
        const I64 qoff = (I64{b} * T + s) * 3 * C + I64{h} * hs;
        const I64 yoff = (I64{b} * T + s) * C + I64{h} * hs;
        const A* q = aqkv + qoff;
        const A* k = q + C;
        const A* v = q + 2 * C;
        A* dq = adqkv + qoff;
        A* dk = dq + C;
        A* dv = dq + 2 * C;
        const A* dy = adout + yoff;
        const A* y = aout + yoff;
        const A* l = lse + I64{p} * T + s;
        gemm_serial<A>(false, true, L, L, hs, scale, q, 3 * C, k, 3 * C, A(0), a, L);
        for (int t = 0; t < L; ++t) {
          causal_probs_row(a + I64{t} * L, l[t], first_visible_key(0, t, window), t, L);
        }
        gemm_serial<A>(false, true, L, L, hs, A(1), dy, C, v, 3 * C, A(0), da, L);
        gemm_serial<A>(true, false, L, hs, L, A(1), a, L, dy, C, A(1), dv, 3 * C);
        for (int t = 0; t < L; ++t) {
          // D = dout . out: equal to sum_u p dp, but what the fused kernels can afford.
          A dot = 0;
          for (int d = 0; d < hs; ++d) dot += dy[I64{t} * C + d] * y[I64{t} * C + d];
          // The row's keys [lo, t]; the probabilities are 0 outside them, so are their gradients.
          const int lo = first_visible_key(0, t, window);
          A* drow = da + I64{t} * L;
          const A* arow = a + I64{t} * L;
          std::fill(drow, drow + lo, A(0));
          if constexpr (std::is_same_v<A, float>) {
            span_softmax_grad(drow + lo, arow + lo, t + 1 - lo, dot);
          } else {
            for (int u = lo; u <= t; ++u) drow[u] = arow[u] * (drow[u] - dot);
          }
          for (int u = t + 1; u < L; ++u) drow[u] = A(0);
        }
        gemm_serial<A>(false, false, L, hs, L, scale, da, L, k, 3 * C, A(1), dq, 3 * C);
        gemm_serial<A>(true, false, L, hs, L, scale, da, L, q, 3 * C, A(1), dk, 3 * C);
      }
    }
  }
}
}  // namespace

template <typename S>
void attention_forward(S* out, acc_t<S>* lse, const S* qkv, int B, int T, int C, int NH,
                       acc_t<S>* ws, const std::int32_t* doc_start, int window,
                       AttentionPath path) {
  using A = acc_t<S>;
  check_doc_start(doc_start, B, T);
  window = effective_window(window, T);
  path = attention_resolve<S>(path, B, T, NH);
  const A* aqkv;
  A* aout;
  if constexpr (!kIs16Bit<S>) {
    aqkv = qkv;
    aout = out;
  } else {
    A* f = ws + attention_scratch<S>(false, B, T, C, NH, path);
    convert_to_acc(f, qkv, I64{B} * T * 3 * C);
    aqkv = f;
    aout = f + I64{B} * T * 3 * C;
  }
  if (path == AttentionPath::kTiled) {
    tiled_attention_forward<A>(aout, lse, aqkv, B, T, C, NH, ws, doc_start, window);
  } else {
    full_attention_forward<A>(aout, lse, aqkv, B, T, C, NH, ws, all_spans(doc_start, B, T), window);
  }
  if constexpr (kIs16Bit<S>) convert_from_acc(out, aout, I64{B} * T * C);
}

template <typename S>
void attention_backward(S* dqkv, const S* dout, const S* qkv, const S* out, const acc_t<S>* lse,
                        int B, int T, int C, int NH, acc_t<S>* ws, const std::int32_t* doc_start,
                        int window, AttentionPath path) {
  using A = acc_t<S>;
  check_doc_start(doc_start, B, T);
  window = effective_window(window, T);
  path = attention_resolve<S>(path, B, T, NH);
  const A* aqkv;
  const A* adout;
  const A* aout;
  A* adqkv;
  if constexpr (!kIs16Bit<S>) {
    aqkv = qkv;
    adout = dout;
    aout = out;
    adqkv = dqkv;
  } else {
    A* f = ws + attention_scratch<S>(true, B, T, C, NH, path);
    A* fqkv = f;
    A* fdqkv = fqkv + I64{B} * T * 3 * C;
    A* fdout = fdqkv + I64{B} * T * 3 * C;
    A* fout = fdout + I64{B} * T * C;
    convert_to_acc(fqkv, qkv, I64{B} * T * 3 * C);
    convert_to_acc(fdout, dout, I64{B} * T * C);
    convert_to_acc(fout, out, I64{B} * T * C);
    std::fill(fdqkv, fdqkv + I64{B} * T * 3 * C, A(0));
    aqkv = fqkv;
    adout = fdout;
    aout = fout;
    adqkv = fdqkv;
  }
  if (path == AttentionPath::kTiled) {
    tiled_attention_backward<A>(adqkv, adout, aqkv, aout, lse, B, T, C, NH, ws, doc_start, window);
  } else {
    full_attention_backward<A>(adqkv, adout, aqkv, aout, lse, B, T, C, NH, ws,
                               all_spans(doc_start, B, T), window);
  }
  if constexpr (kIs16Bit<S>) accumulate_from_acc(dqkv, adqkv, I64{B} * T * 3 * C);
}

#define ZRT_INSTANTIATE(S)                                                                         \
  template std::int64_t attention_forward_workspace<S>(int, int, int, int, AttentionPath);         \
  template std::int64_t attention_backward_workspace<S>(int, int, int, int, AttentionPath);        \
  template void attention_forward<S>(S*, acc_t<S>*, const S*, int, int, int, int, acc_t<S>*,       \
                                     const std::int32_t*, int, AttentionPath);                     \
  template void attention_backward<S>(S*, const S*, const S*, const S*, const acc_t<S>*, int, int, \
                                      int, int, acc_t<S>*, const std::int32_t*, int,               \
                                      AttentionPath);
ZRT_INSTANTIATE(float)
ZRT_INSTANTIATE(double)
ZRT_INSTANTIATE(bf16)
ZRT_INSTANTIATE(fp16)
#undef ZRT_INSTANTIATE

}  // namespace zrt::kernels::cpu
