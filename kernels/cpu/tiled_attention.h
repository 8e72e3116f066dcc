// Flash-style causal attention on the CPU: the algorithm attention.h runs as AttentionPath::kTiled
// for long sequences (attention_path.h), on the same contract and the same layouts as attention.h,
// in the compute type A (float or double) only: qkv (B,T,3C), out (B,T,C), lse (B,NH,T),
// dqkv (B,T,3C) accumulated into (+=). attention.cc converts 16-bit storage around it.
//
// Tiles: a query tile is kTiledAttentionQueryRows consecutive rows of one (b,h) pair, a key tile
// kTiledAttentionKeyRows consecutive keys; the last tile of a sequence may be shorter. Row t sees
// keys [lo(t), t] (lo: its document's first token, or under a sliding window t - window + 1 if
// later, documents.h' first_visible_key; 0 without either), so in any
// key tile a row's visible keys are one contiguous span, possibly empty; key tiles no row of a
// query tile sees are never computed.
//   forward, per (b, h, query tile): for each key tile from lo(first row) up to the tile's last
//     row: s = q k^T / sqrt(hs); per row, over its span: m' = max(m, max s), e = exp(s - m'),
//     l = l exp(m - m') + sum e, o = o exp(m - m') + e v (the online softmax); finally out =
//     o / l and lse = m + log(l), the statistic attention.h keeps.
//   backward: D = dout . out per row first; then each tile's p = exp(s - lse) recomputed from
//     lse, dp = dout v^T, ds = p (dp - D), as attention.h. Two parallel loops, so that every
//     output row has one writer and a fixed order of additions: per (b, h, key tile), over the
//     query tiles that see it, dv += p^T dout and dk += ds^T q / sqrt(hs); per (b, h, query
//     tile), over its key tiles, dq += ds k / sqrt(hs). (The scores and dp of a tile are
//     recomputed by both loops: seven tile GEMMs instead of five, for no atomics and no
//     per-thread partial sums.)
// All accumulation is in A. fp32 rows use vec_math.h's span functions (compiled per ISA, picked
// at run time); the tile products are single-threaded BLAS calls. Work items are shared out
// dynamically over at most kTiledAttentionSlots threads, each with its own slot of `ws` as
// scratch that every item rewrites before reading; an item's results depend on its inputs only,
// so they depend on neither the thread count nor the scheduling.
//
// Workspace (elements of A): forward, slots * (Q*K + Q*hs + 2*Q); backward, B*NH*T (D) + slots *
// 2*Q*K, with Q, K the tile sizes and slots = min(kTiledAttentionSlots, work items): no T^2 term.
//
// Grouped-query form (tiled_gqa_*, gqa_attention.h's tiled path): q (B,T,NH,hs), k and v
// (B,T,NKV,hs) read where they are, query head h reading key/value head h / (NH/NKV), instead of
// a packed qkv with each key/value head repeated; out (B,T,NH,hs). The backward's dk/dv items are
// (b, key/value head, key tile), over the group's query heads in order. dq, dk, dv are
// accumulated into once per item from sums kept in its slot, started from zeros: dq += the
// query head's gradient, dk (dv) += the sum over the group's heads in order; the same additions
// in the same order as running the packed kernel on a zeroed dqkv and unpacking it
// (gqa_unpack_dqkv), so the same bits. Its backward slots hold 4*max(Q,K)*hs elements more for
// those sums.
#pragma once

#include <cstdint>

namespace zrt::kernels::cpu {

constexpr int kTiledAttentionQueryRows = 64;
constexpr int kTiledAttentionKeyRows = 64;
constexpr int kTiledAttentionSlots = 64;

template <typename A>
std::int64_t tiled_attention_forward_workspace(int B, int T, int C, int NH);
template <typename A>
std::int64_t tiled_attention_backward_workspace(int B, int T, int C, int NH);

// doc_start must be valid (check_doc_start) or null; window 0 (none) or in [1, T).
template <typename A>
void tiled_attention_forward(A* out, A* lse, const A* qkv, int B, int T, int C, int NH, A* ws,
                             const std::int32_t* doc_start, int window);

// `out` and `lse` are the forward's results; dqkv is accumulated into.
template <typename A>
void tiled_attention_backward(A* dqkv, const A* dout, const A* qkv, const A* out, const A* lse,
                              int B, int T, int C, int NH, A* ws, const std::int32_t* doc_start,
                              int window);

template <typename A>
std::int64_t tiled_gqa_attention_forward_workspace(int B, int T, int NH, int hs);
template <typename A>
std::int64_t tiled_gqa_attention_backward_workspace(int B, int T, int NH, int hs);

// doc_start must be valid (check_doc_start) or null; window as above; NKV divides NH.
template <typename A>
void tiled_gqa_attention_forward(A* out, A* lse, const A* q, const A* k, const A* v, int B, int T,
                                 int NH, int NKV, int hs, A* ws, const std::int32_t* doc_start,
                                 int window);

// `out` and `lse` are the forward's results; dq, dk, dv are accumulated into.
template <typename A>
void tiled_gqa_attention_backward(A* dq, A* dk, A* dv, const A* dout, const A* q, const A* k,
                                  const A* v, const A* out, const A* lse, int B, int T, int NH,
                                  int NKV, int hs, A* ws, const std::int32_t* doc_start,
                                  int window);

}  // namespace zrt::kernels::cpu
