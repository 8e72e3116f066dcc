#include "kernels/cpu/tiled_attention.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include <omp.h>

#include "kernels/cpu/documents.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/vec_math.h"

namespace zrt::kernels::cpu {

namespace {
using I64 = std::int64_t;
constexpr int kTiledQ = kTiledAttentionQueryRows;
constexpr int kTiledK = kTiledAttentionKeyRows;

// Per token t of every sequence (B,T): lo, the first key query t sees (its document's first
// token, or under a sliding window t - window + 1 if later); end, one past the last query that
// sees key t (its document's end, or t + window if earlier). Both are non-decreasing in t.
struct TiledTokenDocs {
  std::vector<int> lo, end;
};

TiledTokenDocs tiled_token_docs(const std::int32_t* doc_start, int window, int B, int T) {
  TiledTokenDocs d{std::vector<int>(static_cast<std::size_t>(B) * T),
                   std::vector<int>(static_cast<std::size_t>(B) * T)};
  for (int b = 0; b < B; ++b) {
    for (const DocSpan& s : document_spans(doc_start, b, T)) {
      for (int t = s.begin; t < s.end; ++t) {
        d.lo[static_cast<std::size_t>(b) * T + t] = first_visible_key(s.begin, t, window);
        d.end[static_cast<std::size_t>(b) * T + t] =
            window > 0 ? std::min(s.end, t + window) : s.end;
      }
    }
  }
  return d;
}

I64 tiled_count(int T, int rows) {
  return (I64{T} + rows - 1) / rows;
}

int tiled_slots(I64 items) {
  return static_cast<int>(std::min<I64>(kTiledAttentionSlots, std::max<I64>(items, 1)));
}

// Runs f(item, slot) for item in [0, items) on at most `slots` threads, slot in [0, slots) the
// thread's own scratch. Each item rewrites every part of its slot it reads, so which thread (and
// slot) runs an item changes no result; one parallel region, one barrier.
template <typename F>
void tiled_for_each(I64 items, int slots, const F& f) {
  const int threads = std::max(1, std::min(omp_get_max_threads(), slots));
#pragma omp parallel num_threads(threads)
  {
    const int slot = omp_get_thread_num();
#pragma omp for schedule(dynamic, 1)
    for (I64 w = 0; w < items; ++w) f(w, slot);
  }
}

// Row helpers: vec_math.h's span functions for fp32, plain loops for double.
template <typename A>
A tiled_exp(A x) {
  if constexpr (std::is_same_v<A, float>) {
    return exp_approx(x);
  } else {
    return std::exp(x);
  }
}

template <typename A>
A tiled_row_max(const A* x, int n) {
  if constexpr (std::is_same_v<A, float>) {
    return span_max(x, n);
  } else {
    A m = x[0];
    for (int i = 1; i < n; ++i) m = std::max(m, x[i]);
    return m;
  }
}

// x <- exp(x - shift); returns the sum of the new x.
template <typename A>
A tiled_row_exp_sum(A* x, int n, A shift) {
  if constexpr (std::is_same_v<A, float>) {
    span_exp_scale(x, n, shift, 1.0f);
    return span_sum(x, n);
  } else {
    A s = 0;
    for (int i = 0; i < n; ++i) {
      x[i] = std::exp(x[i] - shift);
      s += x[i];
    }
    return s;
  }
}

template <typename A>
void tiled_row_scale(A* x, int n, A scale) {
  if constexpr (std::is_same_v<A, float>) {
    span_scale(x, n, scale);
  } else {
    for (int i = 0; i < n; ++i) x[i] *= scale;
  }
}

template <typename A>
A tiled_row_dot(const A* a, const A* b, int n) {
  if constexpr (std::is_same_v<A, float>) {
    return span_dot(a, b, n);
  } else {
    A s = 0;
    for (int i = 0; i < n; ++i) s += a[i] * b[i];
    return s;
  }
}

// Zeroes row[0, a) and row[e, n): the keys outside a row's span.
template <typename A>
void tiled_zero_outside(A* row, int a, int e, int n) {
  std::fill(row, row + a, A(0));
  std::fill(row + e, row + n, A(0));
}

// One call's shapes and inputs, shared by the passes. q, k and v are read through their own row
// strides (3C each inside a packed qkv), and query head h reads key/value head h / group.
template <typename A>
struct TiledCall {
  int B, T, C, NH, hs, group;  // C = NH*hs: the width of out and dout
  A scale;
  const A *qp, *kp, *vp;
  I64 ldq, ldkv;
  const int* lo;   // (B,T)
  const int* end;  // (B,T)

  const A* q(int b, int h, int t) const { return qp + (I64{b} * T + t) * ldq + I64{h} * hs; }
  const A* k(int b, int h, int t) const {
    return kp + (I64{b} * T + t) * ldkv + I64{h / group} * hs;
  }
  const A* v(int b, int h, int t) const {
    return vp + (I64{b} * T + t) * ldkv + I64{h / group} * hs;
  }
  // The span of row t's keys inside the key tile [j0, j1), as offsets [a, e) from j0 (a >= e:
  // none).
  void span(int b, int t, int j0, int j1, int& a, int& e) const {
    a = std::max(lo[I64{b} * T + t], j0) - j0;
    e = std::min(t + 1, j1) - j0;
  }
};

// Where the backward's gradients go. Direct (a packed dqkv, group 1): the tile products
// accumulate into dq, dk, dv themselves. Gathered (grouped-query): each item sums its products
// in its slot, from zeros, and adds the sum to dq (dk, dv: the sums of the group's heads, in
// order, from zeros) once: the additions, in the order, of packing into a zeroed dqkv and
// unpacking it (gqa_unpack_dqkv).
template <typename A>
struct TiledGrads {
  A *dq, *dk, *dv;
  I64 ldq, ldkv;
  bool direct;
};

// Query rows [i0, i1) of pair (b,h) against key tile [j0, j1) for the backward: P <- the
// probabilities, dS <- p (dp - D), both (i1-i0) x (j1-j0), zero outside each row's span.
template <typename A>
void tiled_tile_grads(const TiledCall<A>& c, const A* dout, const A* lse, const A* D, int b, int h,
                      int i0, int i1, int j0, int j1, A* P, A* dS) {
  const int nq = i1 - i0, nk = j1 - j0, C = c.C;
  const A* dy = dout + (I64{b} * c.T + i0) * C + I64{h} * c.hs;
  gemm_serial<A>(false, true, nq, nk, c.hs, c.scale, c.q(b, h, i0), c.ldq, c.k(b, h, j0), c.ldkv,
                 A(0), P, nk);
  gemm_serial<A>(false, true, nq, nk, c.hs, A(1), dy, C, c.v(b, h, j0), c.ldkv, A(0), dS, nk);
  const I64 stat = (I64{b} * c.NH + h) * c.T;
  for (int r = 0; r < nq; ++r) {
    const int t = i0 + r;
    int a, e;
    c.span(b, t, j0, j1, a, e);
    A* prow = P + I64{r} * nk;
    A* drow = dS + I64{r} * nk;
    if (a >= e) {
      std::fill(prow, prow + nk, A(0));
      std::fill(drow, drow + nk, A(0));
      continue;
    }
    const A l = lse[stat + t], d = D[stat + t];
    if constexpr (std::is_same_v<A, float>) {
      span_exp_scale(prow + a, e - a, l, 1.0f);
      span_softmax_grad(drow + a, prow + a, e - a, d);
    } else {
      for (int u = a; u < e; ++u) {
        prow[u] = std::exp(prow[u] - l);
        drow[u] = prow[u] * (drow[u] - d);
      }
    }
    tiled_zero_outside(prow, a, e, nk);
    tiled_zero_outside(drow, a, e, nk);
  }
}

// dst's n rows (stride ld) += src's (n, hs), rows in turn.
template <typename A>
void tiled_add_rows(A* dst, I64 ld, const A* src, int n, int hs) {
  for (int r = 0; r < n; ++r) {
    A* row = dst + I64{r} * ld;
    const A* add = src + I64{r} * hs;
    for (int d = 0; d < hs; ++d) row[d] += add[d];
  }
}

// Elements of one backward slot: P and dS, and for gathered gradients two (K, hs) sums and two
// (K, hs) products (dq's sum takes the first (Q, hs)).
I64 tiled_backward_slot(int hs, bool gathered) {
  const I64 tiles = 2 * I64{kTiledQ} * kTiledK;
  return gathered ? tiles + 4 * I64{std::max(kTiledQ, kTiledK)} * hs : tiles;
}

I64 tiled_forward_workspace_elements(int B, int T, int NH, int hs) {
  const I64 slots = tiled_slots(I64{B} * NH * tiled_count(T, kTiledQ));
  return slots * (I64{kTiledQ} * kTiledK + I64{kTiledQ} * hs + 2 * I64{kTiledQ});
}

I64 tiled_backward_workspace_elements(int B, int T, int NH, int hs, bool gathered) {
  const I64 pairs = I64{B} * NH;
  const I64 slots = tiled_slots(pairs * std::max(tiled_count(T, kTiledQ), tiled_count(T, kTiledK)));
  return pairs * T + slots * tiled_backward_slot(hs, gathered);
}
}  // namespace

template <typename A>
std::int64_t tiled_attention_forward_workspace(int B, int T, int C, int NH) {
  return tiled_forward_workspace_elements(B, T, NH, C / NH);
}

template <typename A>
std::int64_t tiled_attention_backward_workspace(int B, int T, int C, int NH) {
  return tiled_backward_workspace_elements(B, T, NH, C / NH, false);
}

template <typename A>
std::int64_t tiled_gqa_attention_forward_workspace(int B, int T, int NH, int hs) {
  return tiled_forward_workspace_elements(B, T, NH, hs);
}

template <typename A>
std::int64_t tiled_gqa_attention_backward_workspace(int B, int T, int NH, int hs) {
  return tiled_backward_workspace_elements(B, T, NH, hs, true);
}

namespace {
// The passes' bodies live here, not in the exported templates: their lambdas capture this file's
// internal types, which a closure type of an exported function may not (GCC's subobject-linkage,
// an error once a unity build includes this file).
template <typename A>
TiledCall<A> tiled_call(const TiledTokenDocs& docs, int B, int T, int NH, int NKV, int hs,
                        const A* q, const A* k, const A* v, I64 ldq, I64 ldkv) {
  TiledCall<A> c{};
  c.B = B;
  c.T = T;
  c.C = NH * hs;
  c.NH = NH;
  c.hs = hs;
  c.group = NH / NKV;
  c.scale = A(1) / std::sqrt(static_cast<A>(hs));
  c.qp = q;
  c.kp = k;
  c.vp = v;
  c.ldq = ldq;
  c.ldkv = ldkv;
  c.lo = docs.lo.data();
  c.end = docs.end.data();
  return c;
}

template <typename A>
void tiled_forward_body(A* out, A* lse, const TiledCall<A>& c, A* ws) {
  const int B = c.B, T = c.T, C = c.C, NH = c.NH, hs = c.hs;
  const I64 qtiles = tiled_count(T, kTiledQ);
  const I64 items = I64{B} * NH * qtiles;
  const int slots = tiled_slots(items);
  const I64 slot_size = I64{kTiledQ} * kTiledK + I64{kTiledQ} * hs + 2 * I64{kTiledQ};
  tiled_for_each(items, slots, [&](I64 w, int slot) {
    const int b = static_cast<int>(w / (I64{NH} * qtiles));
    const int h = static_cast<int>(w / qtiles % NH);
    const int i0 = static_cast<int>(w % qtiles) * kTiledQ, i1 = std::min(T, i0 + kTiledQ),
              nq = i1 - i0;
    A* S = ws + slot * slot_size;
    A* O = S + I64{kTiledQ} * kTiledK;
    A* m = O + I64{kTiledQ} * hs;
    A* l = m + kTiledQ;
    std::fill(O, O + I64{nq} * hs, A(0));
    std::fill(m, m + nq, A(0));
    std::fill(l, l + nq, A(0));  // l == 0: the row has seen no key yet
    const A* q = c.q(b, h, i0);
    for (int j0 = c.lo[I64{b} * T + i0]; j0 < i1; j0 += kTiledK) {
      const int j1 = std::min(i1, j0 + kTiledK), nk = j1 - j0;
      gemm_serial<A>(false, true, nq, nk, hs, c.scale, q, c.ldq, c.k(b, h, j0), c.ldkv, A(0), S,
                     nk);
      for (int r = 0; r < nq; ++r) {
        int a, e;
        c.span(b, i0 + r, j0, j1, a, e);
        A* row = S + I64{r} * nk;
        if (a >= e) {
          std::fill(row, row + nk, A(0));
          continue;
        }
        const A tile_max = tiled_row_max(row + a, e - a);
        const A m_new = l[r] == A(0) ? tile_max : std::max(m[r], tile_max);
        if (l[r] != A(0) && m_new != m[r]) {  // rescale what the earlier key tiles summed
          const A corr = tiled_exp(m[r] - m_new);
          l[r] *= corr;
          tiled_row_scale(O + I64{r} * hs, hs, corr);
        }
        l[r] += tiled_row_exp_sum(row + a, e - a, m_new);
        m[r] = m_new;
        tiled_zero_outside(row, a, e, nk);
      }
      gemm_serial<A>(false, false, nq, hs, nk, A(1), S, nk, c.v(b, h, j0), c.ldkv, A(1), O, hs);
    }
    for (int r = 0; r < nq; ++r) {
      const int t = i0 + r;
      A* y = out + (I64{b} * T + t) * C + I64{h} * hs;
      const A inv = A(1) / l[r];
      for (int d = 0; d < hs; ++d) y[d] = O[I64{r} * hs + d] * inv;
      lse[(I64{b} * NH + h) * T + t] = m[r] + std::log(l[r]);
    }
  });
}

template <typename A>
void tiled_backward_body(const TiledGrads<A>& g, const A* dout, const A* out, const A* lse,
                         const TiledCall<A>& c, A* ws) {
  const int B = c.B, T = c.T, C = c.C, NH = c.NH, hs = c.hs, group = c.group;
  const int NKV = NH / group;
  const I64 pairs = I64{B} * NH;
  A* D = ws;  // (B,NH,T): dout . out per row, as the fused kernels take it
  A* slots_ws = D + pairs * T;
#pragma omp parallel for schedule(static)
  for (I64 bt = 0; bt < I64{B} * T; ++bt) {
    const I64 b = bt / T, t = bt % T;
    for (int h = 0; h < NH; ++h) {
      const I64 off = bt * C + I64{h} * hs;
      D[(b * NH + h) * T + t] = tiled_row_dot(dout + off, out + off, hs);
    }
  }
  const I64 qtiles = tiled_count(T, kTiledQ), ktiles = tiled_count(T, kTiledK);
  const int slots = tiled_slots(pairs * std::max(qtiles, ktiles));
  const I64 slot_size = tiled_backward_slot(hs, !g.direct);
  const I64 kv_rows = I64{std::max(kTiledQ, kTiledK)} * hs;
  // dk, dv: per (b, key/value head, key tile), over the group's query heads in order and the query
  // rows that see the tile (from its first key to the end of its last key's document).
  tiled_for_each(I64{B} * NKV * ktiles, slots, [&](I64 w, int slot) {
    const int b = static_cast<int>(w / (I64{NKV} * ktiles));
    const int kh = static_cast<int>(w / ktiles % NKV);
    const int j0 = static_cast<int>(w % ktiles) * kTiledK, j1 = std::min(T, j0 + kTiledK),
              nk = j1 - j0;
    const int rows_end = c.end[I64{b} * T + j1 - 1];
    A* P = slots_ws + slot * slot_size;
    A* dS = P + I64{kTiledQ} * kTiledK;
    A* sum_k = dS + I64{kTiledQ} * kTiledK;  // gathered only
    A* sum_v = sum_k + kv_rows;
    A* part_k = sum_v + kv_rows;
    A* part_v = part_k + kv_rows;
    A* dk = g.dk + (I64{b} * T + j0) * g.ldkv + I64{kh} * hs;
    A* dv = g.dv + (I64{b} * T + j0) * g.ldkv + I64{kh} * hs;
    if (!g.direct) {
      std::fill(sum_k, sum_k + I64{nk} * hs, A(0));
      std::fill(sum_v, sum_v + I64{nk} * hs, A(0));
    }
    for (int gi = 0; gi < group; ++gi) {
      const int h = kh * group + gi;
      A* into_k = g.direct ? dk : part_k;
      A* into_v = g.direct ? dv : part_v;
      const I64 ld = g.direct ? g.ldkv : hs;
      if (!g.direct) {
        std::fill(part_k, part_k + I64{nk} * hs, A(0));
        std::fill(part_v, part_v + I64{nk} * hs, A(0));
      }
      for (int i0 = j0; i0 < rows_end; i0 += kTiledQ) {
        const int i1 = std::min(rows_end, i0 + kTiledQ), nq = i1 - i0;
        tiled_tile_grads(c, dout, lse, D, b, h, i0, i1, j0, j1, P, dS);
        const A* dy = dout + (I64{b} * T + i0) * C + I64{h} * hs;
        gemm_serial<A>(true, false, nk, hs, nq, A(1), P, nk, dy, C, A(1), into_v, ld);
        gemm_serial<A>(true, false, nk, hs, nq, c.scale, dS, nk, c.q(b, h, i0), c.ldq, A(1), into_k,
                       ld);
      }
      if (!g.direct) {
        for (I64 i = 0; i < I64{nk} * hs; ++i) sum_k[i] += part_k[i];
        for (I64 i = 0; i < I64{nk} * hs; ++i) sum_v[i] += part_v[i];
      }
    }
    if (!g.direct) {
      tiled_add_rows(dk, g.ldkv, sum_k, nk, hs);
      tiled_add_rows(dv, g.ldkv, sum_v, nk, hs);
    }
  });
  // dq: per (b, h, query tile), over the key tiles its rows see.
  tiled_for_each(pairs * qtiles, slots, [&](I64 w, int slot) {
    const int b = static_cast<int>(w / (I64{NH} * qtiles));
    const int h = static_cast<int>(w / qtiles % NH);
    const int i0 = static_cast<int>(w % qtiles) * kTiledQ, i1 = std::min(T, i0 + kTiledQ),
              nq = i1 - i0;
    A* P = slots_ws + slot * slot_size;
    A* dS = P + I64{kTiledQ} * kTiledK;
    A* sum_q = dS + I64{kTiledQ} * kTiledK;  // gathered only
    A* dq = g.dq + (I64{b} * T + i0) * g.ldq + I64{h} * hs;
    A* into = g.direct ? dq : sum_q;
    const I64 ld = g.direct ? g.ldq : hs;
    if (!g.direct) std::fill(sum_q, sum_q + I64{nq} * hs, A(0));
    for (int j0 = c.lo[I64{b} * T + i0]; j0 < i1; j0 += kTiledK) {
      const int j1 = std::min(i1, j0 + kTiledK), nk = j1 - j0;
      tiled_tile_grads(c, dout, lse, D, b, h, i0, i1, j0, j1, P, dS);
      gemm_serial<A>(false, false, nq, hs, nk, c.scale, dS, nk, c.k(b, h, j0), c.ldkv, A(1), into,
                     ld);
    }
    if (!g.direct) tiled_add_rows(dq, g.ldq, sum_q, nq, hs);
  });
}

}  // namespace

template <typename A>
void tiled_attention_forward(A* out, A* lse, const A* qkv, int B, int T, int C, int NH, A* ws,
                             const std::int32_t* doc_start, int window) {
  const TiledTokenDocs docs = tiled_token_docs(doc_start, window, B, T);
  const TiledCall<A> c =
      tiled_call<A>(docs, B, T, NH, NH, C / NH, qkv, qkv + C, qkv + 2 * C, 3 * I64{C}, 3 * I64{C});
  tiled_forward_body(out, lse, c, ws);
}

template <typename A>
void tiled_attention_backward(A* dqkv, const A* dout, const A* qkv, const A* out, const A* lse,
                              int B, int T, int C, int NH, A* ws, const std::int32_t* doc_start,
                              int window) {
  const TiledTokenDocs docs = tiled_token_docs(doc_start, window, B, T);
  const TiledCall<A> c =
      tiled_call<A>(docs, B, T, NH, NH, C / NH, qkv, qkv + C, qkv + 2 * C, 3 * I64{C}, 3 * I64{C});
  const TiledGrads<A> g{dqkv, dqkv + C, dqkv + 2 * C, 3 * I64{C}, 3 * I64{C}, true};
  tiled_backward_body(g, dout, out, lse, c, ws);
}

template <typename A>
void tiled_gqa_attention_forward(A* out, A* lse, const A* q, const A* k, const A* v, int B, int T,
                                 int NH, int NKV, int hs, A* ws, const std::int32_t* doc_start,
                                 int window) {
  const TiledTokenDocs docs = tiled_token_docs(doc_start, window, B, T);
  const TiledCall<A> c =
      tiled_call<A>(docs, B, T, NH, NKV, hs, q, k, v, I64{NH} * hs, I64{NKV} * hs);
  tiled_forward_body(out, lse, c, ws);
}

template <typename A>
void tiled_gqa_attention_backward(A* dq, A* dk, A* dv, const A* dout, const A* q, const A* k,
                                  const A* v, const A* out, const A* lse, int B, int T, int NH,
                                  int NKV, int hs, A* ws, const std::int32_t* doc_start,
                                  int window) {
  const TiledTokenDocs docs = tiled_token_docs(doc_start, window, B, T);
  const TiledCall<A> c =
      tiled_call<A>(docs, B, T, NH, NKV, hs, q, k, v, I64{NH} * hs, I64{NKV} * hs);
  const TiledGrads<A> g{dq, dk, dv, I64{NH} * hs, I64{NKV} * hs, false};
  tiled_backward_body(g, dout, out, lse, c, ws);
}

#define ZRT_INSTANTIATE(A)                                                                        \
  template std::int64_t tiled_attention_forward_workspace<A>(int, int, int, int);                 \
  template std::int64_t tiled_attention_backward_workspace<A>(int, int, int, int);                \
  template void tiled_attention_forward<A>(A*, A*, const A*, int, int, int, int, A*,              \
                                           const std::int32_t*, int);                             \
  template void tiled_attention_backward<A>(A*, const A*, const A*, const A*, const A*, int, int, \
                                            int, int, A*, const std::int32_t*, int);              \
  template std::int64_t tiled_gqa_attention_forward_workspace<A>(int, int, int, int);             \
  template std::int64_t tiled_gqa_attention_backward_workspace<A>(int, int, int, int);            \
  template void tiled_gqa_attention_forward<A>(A*, A*, const A*, const A*, const A*, int, int,    \
                                               int, int, int, A*, const std::int32_t*, int);      \
  template void tiled_gqa_attention_backward<A>(A*, A*, A*, const A*, const A*, const A*,         \
                                                const A*, const A*, const A*, int, int, int, int, \
                                                int, A*, const std::int32_t*, int);
ZRT_INSTANTIATE(float)
ZRT_INSTANTIATE(double)
#undef ZRT_INSTANTIATE

}  // namespace zrt::kernels::cpu
