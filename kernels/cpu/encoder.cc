#include "kernels/cpu/encoder.h"

#include <algorithm>
#include <vector>

#include "runtime/common/error.h"

namespace zrt::kernels::cpu {

namespace {
void check_tokens(const std::int32_t* tokens, std::int64_t n, int V) {
  for (std::int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= V) {
      ZRT_THROW(InvalidArgument, "token id {} at position {} is outside the vocabulary [0, {})",
                tokens[i], i, V);
    }
  }
}

void check_positions(const std::int32_t* positions, std::int64_t n, int P) {
  for (std::int64_t i = 0; i < n; ++i) {
    if (positions[i] < 0 || positions[i] >= P) {
      ZRT_THROW(InvalidArgument, "position {} of token {} is outside the position table [0, {})",
                positions[i], i, P);
    }
  }
}

// For rows with ids in [0, n_ids): next[r] the next row with r's id (-1: none); first[r] whether
// r is its id's first row. The chains give each id's rows in (b,t) order.
void id_chains(const std::int32_t* ids, std::int64_t rows, int n_ids,
               std::vector<std::int64_t>& next, std::vector<char>& first) {
  next.assign(rows, -1);
  first.assign(rows, 0);
  std::vector<std::int64_t> last(n_ids, -1);
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int32_t v = ids[r];
    if (last[v] < 0) {
      first[r] = 1;
    } else {
      next[last[v]] = r;
    }
    last[v] = r;
  }
}

// table[ids[r],:] += the sum of dout[r,:] over each id's rows, in (b,t) order in an A
// accumulator, added once per id.
template <typename A, typename S, typename G>
void add_row_sums(G* table, const S* dout, const std::int32_t* ids, std::int64_t rows, int n_ids,
                  int C) {
  std::vector<std::int64_t> next;
  std::vector<char> first;
  id_chains(ids, rows, n_ids, next, first);
#pragma omp parallel
  {
    std::vector<A> sum(C);
#pragma omp for schedule(dynamic, 16)
    for (std::int64_t r = 0; r < rows; ++r) {
      if (!first[r]) continue;
      std::fill(sum.begin(), sum.end(), A(0));
      for (std::int64_t q = r; q >= 0; q = next[q]) {
        const S* d = dout + q * C;
        for (int c = 0; c < C; ++c) sum[c] += load<A>(d[c]);
      }
      G* dw = table + static_cast<std::int64_t>(ids[r]) * C;
      for (int c = 0; c < C; ++c) dw[c] = store<G>(load<A>(dw[c]) + sum[c]);
    }
  }
}
}  // namespace

template <typename S>
void encoder_forward(S* out, const std::int32_t* tokens, const S* wte, const S* wpe, int B, int T,
                     int C, int V, const std::int32_t* positions, int position_rows) {
  using A = acc_t<S>;
  const std::int64_t rows = static_cast<std::int64_t>(B) * T;
  check_tokens(tokens, rows, V);
  if (positions != nullptr && wpe != nullptr) {
    check_positions(positions, rows, position_rows > 0 ? position_rows : T);
  }
#pragma omp parallel for schedule(static)
  for (std::int64_t r = 0; r < rows; ++r) {
    const int t = positions != nullptr ? positions[r] : static_cast<int>(r % T);
    const S* w = wte + static_cast<std::int64_t>(tokens[r]) * C;
    S* o = out + r * C;
    if (wpe == nullptr) {  // no position embedding (Llama: positions come from RoPE)
      for (int c = 0; c < C; ++c) o[c] = w[c];
      continue;
    }
    const S* p = wpe + static_cast<std::int64_t>(t) * C;
    for (int c = 0; c < C; ++c) o[c] = store<S>(load<A>(w[c]) + load<A>(p[c]));
  }
}

template <typename S, typename G>
void encoder_backward(G* dwte, G* dwpe, const S* dout, const std::int32_t* tokens, int B, int T,
                      int C, int V, const std::int32_t* positions, int position_rows) {
  using A = acc_t<S>;
  const std::int64_t rows = static_cast<std::int64_t>(B) * T;
  check_tokens(tokens, rows, V);
  if (dwte != nullptr) add_row_sums<A>(dwte, dout, tokens, rows, V, C);  // null: frozen
  if (dwpe == nullptr) return;
  if (positions != nullptr) {  // packed documents: a position's rows, wherever they are
    const int P = position_rows > 0 ? position_rows : T;
    check_positions(positions, rows, P);
    add_row_sums<A>(dwpe, dout, positions, rows, P, C);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int t = 0; t < T; ++t) {
    G* dp = dwpe + static_cast<std::int64_t>(t) * C;
    for (int c = 0; c < C; ++c) {
      A sum = 0;
      for (int b = 0; b < B; ++b)
        sum += load<A>(dout[(static_cast<std::int64_t>(b) * T + t) * C + c]);
      dp[c] = store<G>(load<A>(dp[c]) + sum);
    }
  }
}

#define ZRT_FWD(S)                                                                             \
  template void encoder_forward<S>(S*, const std::int32_t*, const S*, const S*, int, int, int, \
                                   int, const std::int32_t*, int);
#define ZRT_BWD(S, G)                                                                             \
  template void encoder_backward<S, G>(G*, G*, const S*, const std::int32_t*, int, int, int, int, \
                                       const std::int32_t*, int);
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
