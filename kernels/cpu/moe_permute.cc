#include "kernels/cpu/moe_permute.h"

#include <algorithm>
#include <vector>

#include "runtime/common/error.h"

namespace zrt::kernels::cpu {

namespace {
using I64 = std::int64_t;
}  // namespace

void moe_dispatch_plan(std::int32_t* counts, std::int32_t* offsets, std::int32_t* row_of,
                       std::int32_t* source, const std::int32_t* experts, int N, int k, int E) {
  const I64 pairs = I64{N} * k;
  std::fill(counts, counts + E, 0);
  for (I64 p = 0; p < pairs; ++p) {
    const std::int32_t e = experts[p];
    if (e >= E) ZRT_THROW(InvalidArgument, "moe dispatch: pair {} chose expert {} of {}", p, e, E);
    if (e >= 0) ++counts[e];
  }
  offsets[0] = 0;
  for (int e = 0; e < E; ++e) offsets[e + 1] = offsets[e] + counts[e];
  std::vector<std::int32_t> next(offsets, offsets + E);
  for (I64 p = 0; p < pairs; ++p) {
    const std::int32_t e = experts[p];
    if (e < 0) {
      row_of[p] = -1;
      continue;
    }
    const std::int32_t r = next[e]++;
    row_of[p] = r;
    source[r] = static_cast<std::int32_t>(p);
  }
}

template <typename S>
void moe_gather(S* xe, const S* x, const std::int32_t* row_of, int N, int k, int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    for (int j = 0; j < k; ++j) {
      const std::int32_t r = row_of[I64{n} * k + j];
      if (r >= 0) std::copy(x + I64{n} * C, x + I64{n + 1} * C, xe + I64{r} * C);
    }
  }
}

template <typename S>
void moe_gather_backward(S* dx, const S* dxe, const std::int32_t* row_of, int N, int k, int C) {
  using A = acc_t<S>;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const std::int32_t* rows = row_of + I64{n} * k;
    S* d = dx + I64{n} * C;
    for (int c = 0; c < C; ++c) {
      A sum = load<A>(d[c]);
      for (int j = 0; j < k; ++j) {
        if (rows[j] >= 0) sum += load<A>(dxe[I64{rows[j]} * C + c]);
      }
      d[c] = store<S>(sum);
    }
  }
}

template <typename S>
void moe_combine(S* out, const S* y, const acc_t<S>* w, const std::int32_t* row_of, int N, int k,
                 int C) {
  using A = acc_t<S>;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const std::int32_t* rows = row_of + I64{n} * k;
    const A* wn = w + I64{n} * k;
    S* o = out + I64{n} * C;
    for (int c = 0; c < C; ++c) {
      A sum = 0;
      for (int j = 0; j < k; ++j) {
        if (rows[j] >= 0) sum += wn[j] * load<A>(y[I64{rows[j]} * C + c]);
      }
      o[c] = store<S>(sum);
    }
  }
}

template <typename S>
void moe_combine_backward(S* dy, acc_t<S>* dw, const S* dout, const S* y, const acc_t<S>* w,
                          const std::int32_t* row_of, int N, int k, int C) {
  using A = acc_t<S>;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const S* g = dout + I64{n} * C;
    for (int j = 0; j < k; ++j) {
      const I64 p = I64{n} * k + j;
      const std::int32_t r = row_of[p];
      if (r < 0) {
        dw[p] = 0;
        continue;
      }
      const S* yr = y + I64{r} * C;
      S* dyr = dy + I64{r} * C;
      A dot = 0;
      for (int c = 0; c < C; ++c) {
        const A gc = load<A>(g[c]);
        dot += gc * load<A>(yr[c]);
        dyr[c] = store<S>(w[p] * gc);
      }
      dw[p] = dot;
    }
  }
}

#define ZRT_INSTANTIATE(S)                                                                         \
  template void moe_gather<S>(S*, const S*, const std::int32_t*, int, int, int);                   \
  template void moe_gather_backward<S>(S*, const S*, const std::int32_t*, int, int, int);          \
  template void moe_combine<S>(S*, const S*, const acc_t<S>*, const std::int32_t*, int, int, int); \
  template void moe_combine_backward<S>(S*, acc_t<S>*, const S*, const S*, const acc_t<S>*,        \
                                        const std::int32_t*, int, int, int);
ZRT_INSTANTIATE(float)
ZRT_INSTANTIATE(double)
ZRT_INSTANTIATE(bf16)
ZRT_INSTANTIATE(fp16)
#undef ZRT_INSTANTIATE

}  // namespace zrt::kernels::cpu
