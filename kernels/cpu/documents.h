// Packed documents (kernels/ops.h's `doc_start`), shared by the CPU twins of attention: several
// documents share one training sequence, and attention must stay inside each.
//
// doc_start (B,T) int32: for token t of sequence b, the index within sequence b of the first
// token of t's document. A valid packing has 0 <= doc_start[t] <= t, and doc_start[t] is either
// doc_start[t-1] (t continues its document) or t (t starts one); so the documents of a sequence
// are consecutive spans [begin, end) and query t attends keys [doc_start[t], t]. Null: one
// document per sequence, [0, T).
//
// Sliding window (Mistral's, Qwen2's upper layers'; kernels/ops.h's `window`): with window W > 0
// query t also sees no key before t - W + 1 (W keys at most, itself included), as transformers'
// sliding_window mask; 0 is none. The first key t sees is then first_visible_key(doc_start[t], t,
// W), still non-decreasing in t, which is all the tiled kernels' skipping relies on.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "runtime/common/error.h"

namespace zrt::kernels::cpu {

struct DocSpan {
  int begin = 0, end = 0;  // tokens [begin, end) of one sequence
};

// The first key query t sees: its document's first token, or t - window + 1 when the window
// starts later (window 0: none).
inline int first_visible_key(int doc_begin, int t, int window) {
  return window > 0 ? std::max(doc_begin, t - window + 1) : doc_begin;
}

// A window at least T long hides no key: 0 (none) then, so that the unwindowed kernels run.
// Throws InvalidArgument on a negative window.
inline int effective_window(int window, int T) {
  if (window < 0) {
    ZRT_THROW(InvalidArgument, "attention: sliding window {} is negative (0: none)", window);
  }
  return window >= T ? 0 : window;
}

// Throws InvalidArgument naming the first token that breaks the packing rule above. Null is
// valid.
inline void check_doc_start(const std::int32_t* doc_start, int B, int T) {
  if (doc_start == nullptr) return;
  for (int b = 0; b < B; ++b) {
    const std::int32_t* ds = doc_start + static_cast<std::int64_t>(b) * T;
    for (int t = 0; t < T; ++t) {
      const bool ok = t == 0 ? ds[0] == 0 : (ds[t] == ds[t - 1] || ds[t] == t);
      if (!ok) {
        ZRT_THROW(InvalidArgument,
                  "doc_start[{}] = {} (sequence {}, token {}) is neither the previous token's "
                  "document start {} nor the token itself: not a packing of whole documents",
                  static_cast<std::int64_t>(b) * T + t, ds[t], b, t, t == 0 ? 0 : ds[t - 1]);
      }
    }
  }
}

// The documents of sequence b in order: [0, T) alone when doc_start is null.
inline std::vector<DocSpan> document_spans(const std::int32_t* doc_start, int b, int T) {
  std::vector<DocSpan> spans;
  if (doc_start == nullptr) {
    spans.push_back({0, T});
    return spans;
  }
  const std::int32_t* ds = doc_start + static_cast<std::int64_t>(b) * T;
  for (int t = 0; t < T; ++t) {
    if (ds[t] == t) {
      if (!spans.empty()) spans.back().end = t;
      spans.push_back({t, T});
    }
  }
  return spans;
}

}  // namespace zrt::kernels::cpu
