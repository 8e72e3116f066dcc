#include "kernels/cpu/gqa_attention.h"

#include <algorithm>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/documents.h"
#include "kernels/cpu/tiled_attention.h"
#include "runtime/common/error.h"

namespace zrt::kernels::cpu {

namespace {
using I64 = std::int64_t;

void check_heads(int NH, int NKV, int hs) {
  ZRT_CHECK(NH > 0 && NKV > 0 && NH % NKV == 0 && hs > 0,
            "gqa attention: NH={} must be a positive multiple of NKV={} (hs={})", NH, NKV, hs);
}

// Elements of acc_t<S> the packed qkv (and its gradient) take.
I64 packed(int B, int T, int NH, int hs) {
  return I64{B} * T * 3 * NH * hs;
}

// Whether a call reads q, k, v where they are (the tiled kernel's grouped-query form) instead of
// packing them: fp32 and fp64 storage, which the kernel computes in, on the tiled path. The full
// kernel (short sequences) and 16-bit storage (converted to fp32 anyway) pack.
template <typename S>
bool gqa_reads_in_place(int B, int T, int NH, AttentionPath path) {
  if constexpr (kIs16Bit<S>) {
    return false;
  } else {
    return resolve_attention_path(path, B, T, NH, sizeof(acc_t<S>)) == AttentionPath::kTiled;
  }
}
}  // namespace

template <typename S, typename A>
void gqa_pack_qkv(A* qkv, const S* q, const S* k, const S* v, int B, int T, int NH, int NKV,
                  int hs) {
  const int C = NH * hs, KC = NKV * hs, group = NH / NKV;
#pragma omp parallel for schedule(static)
  for (I64 bt = 0; bt < I64{B} * T; ++bt) {
    A* row = qkv + bt * 3 * C;
    const S* qr = q + bt * C;
    const S* kr = k + bt * KC;
    const S* vr = v + bt * KC;
    for (int i = 0; i < C; ++i) row[i] = load<A>(qr[i]);
    for (int h = 0; h < NH; ++h) {
      const int kh = h / group;
      for (int d = 0; d < hs; ++d) {
        row[C + h * hs + d] = load<A>(kr[kh * hs + d]);
        row[2 * C + h * hs + d] = load<A>(vr[kh * hs + d]);
      }
    }
  }
}

template <typename S, typename A>
void gqa_unpack_dqkv(S* dq, S* dk, S* dv, const A* dqkv, int B, int T, int NH, int NKV, int hs) {
  const int C = NH * hs, KC = NKV * hs, group = NH / NKV;
#pragma omp parallel for schedule(static)
  for (I64 bt = 0; bt < I64{B} * T; ++bt) {
    const A* row = dqkv + bt * 3 * C;
    S* dqr = dq + bt * C;
    S* dkr = dk + bt * KC;
    S* dvr = dv + bt * KC;
    for (int i = 0; i < C; ++i) dqr[i] = store<S>(load<A>(dqr[i]) + row[i]);
    for (int kh = 0; kh < NKV; ++kh) {
      for (int d = 0; d < hs; ++d) {
        A gk = 0, gv = 0;
        for (int g = 0; g < group; ++g) {  // the group's heads in order
          gk += row[C + (kh * group + g) * hs + d];
          gv += row[2 * C + (kh * group + g) * hs + d];
        }
        dkr[kh * hs + d] = store<S>(load<A>(dkr[kh * hs + d]) + gk);
        dvr[kh * hs + d] = store<S>(load<A>(dvr[kh * hs + d]) + gv);
      }
    }
  }
}

template <typename S>
std::int64_t gqa_attention_forward_workspace(int B, int T, int NH, int NKV, int hs,
                                             AttentionPath path) {
  (void)NKV;
  using A = acc_t<S>;
  if (gqa_reads_in_place<S>(B, T, NH, path)) {
    return tiled_gqa_attention_forward_workspace<A>(B, T, NH, hs);
  }
  const I64 out = kIs16Bit<S> ? I64{B} * T * NH * hs : 0;
  return packed(B, T, NH, hs) + out + attention_forward_workspace<A>(B, T, NH * hs, NH, path);
}

template <typename S>
std::int64_t gqa_attention_backward_workspace(int B, int T, int NH, int NKV, int hs,
                                              AttentionPath path) {
  (void)NKV;
  using A = acc_t<S>;
  if (gqa_reads_in_place<S>(B, T, NH, path)) {
    return tiled_gqa_attention_backward_workspace<A>(B, T, NH, hs);
  }
  const I64 dout_out = kIs16Bit<S> ? 2 * I64{B} * T * NH * hs : 0;
  return 2 * packed(B, T, NH, hs) + dout_out +
         attention_backward_workspace<A>(B, T, NH * hs, NH, path);
}

template <typename S>
void gqa_attention_forward(S* out, acc_t<S>* lse, const S* q, const S* k, const S* v, int B, int T,
                           int NH, int NKV, int hs, acc_t<S>* ws, const std::int32_t* doc_start,
                           int window, AttentionPath path) {
  using A = acc_t<S>;
  check_heads(NH, NKV, hs);
  if constexpr (!kIs16Bit<S>) {
    if (gqa_reads_in_place<S>(B, T, NH, path)) {
      check_doc_start(doc_start, B, T);
      tiled_gqa_attention_forward<A>(out, lse, q, k, v, B, T, NH, NKV, hs, ws, doc_start,
                                     effective_window(window, T));
      return;
    }
  }
  const int C = NH * hs;
  A* qkv = ws;
  A* rest = qkv + packed(B, T, NH, hs);
  gqa_pack_qkv<S, A>(qkv, q, k, v, B, T, NH, NKV, hs);
  if constexpr (kIs16Bit<S>) {
    A* aout = rest;
    attention_forward<A>(aout, lse, qkv, B, T, C, NH, aout + I64{B} * T * C, doc_start, window,
                         path);
    convert_from_acc(out, aout, I64{B} * T * C);
  } else {
    attention_forward<A>(out, lse, qkv, B, T, C, NH, rest, doc_start, window, path);
  }
}

template <typename S>
void gqa_attention_backward(S* dq, S* dk, S* dv, const S* dout, const S* q, const S* k, const S* v,
                            const S* out, const acc_t<S>* lse, int B, int T, int NH, int NKV,
                            int hs, acc_t<S>* ws, const std::int32_t* doc_start, int window,
                            AttentionPath path) {
  using A = acc_t<S>;
  check_heads(NH, NKV, hs);
  if constexpr (!kIs16Bit<S>) {
    if (gqa_reads_in_place<S>(B, T, NH, path)) {
      check_doc_start(doc_start, B, T);
      tiled_gqa_attention_backward<A>(dq, dk, dv, dout, q, k, v, out, lse, B, T, NH, NKV, hs, ws,
                                      doc_start, effective_window(window, T));
      return;
    }
  }
  const int C = NH * hs;
  const I64 n = packed(B, T, NH, hs);
  A* qkv = ws;
  A* dqkv = qkv + n;
  A* rest = dqkv + n;
  gqa_pack_qkv<S, A>(qkv, q, k, v, B, T, NH, NKV, hs);
  std::fill(dqkv, dqkv + n, A(0));
  if constexpr (kIs16Bit<S>) {
    A* adout = rest;
    A* aout = adout + I64{B} * T * C;
    convert_to_acc(adout, dout, I64{B} * T * C);
    convert_to_acc(aout, out, I64{B} * T * C);
    attention_backward<A>(dqkv, adout, qkv, aout, lse, B, T, C, NH, aout + I64{B} * T * C,
                          doc_start, window, path);
  } else {
    attention_backward<A>(dqkv, dout, qkv, out, lse, B, T, C, NH, rest, doc_start, window, path);
  }
  gqa_unpack_dqkv<S, A>(dq, dk, dv, dqkv, B, T, NH, NKV, hs);
}

#define ZRT_INSTANTIATE(S)                                                                        \
  template std::int64_t gqa_attention_forward_workspace<S>(int, int, int, int, int,               \
                                                           AttentionPath);                        \
  template std::int64_t gqa_attention_backward_workspace<S>(int, int, int, int, int,              \
                                                            AttentionPath);                       \
  template void gqa_attention_forward<S>(S*, acc_t<S>*, const S*, const S*, const S*, int, int,   \
                                         int, int, int, acc_t<S>*, const std::int32_t*, int,      \
                                         AttentionPath);                                          \
  template void gqa_attention_backward<S>(S*, S*, S*, const S*, const S*, const S*, const S*,     \
                                          const S*, const acc_t<S>*, int, int, int, int, int,     \
                                          acc_t<S>*, const std::int32_t*, int, AttentionPath);    \
  template void gqa_pack_qkv<S, acc_t<S>>(acc_t<S>*, const S*, const S*, const S*, int, int, int, \
                                          int, int);                                              \
  template void gqa_unpack_dqkv<S, acc_t<S>>(S*, S*, S*, const acc_t<S>*, int, int, int, int, int);
ZRT_INSTANTIATE(float)
ZRT_INSTANTIATE(double)
ZRT_INSTANTIATE(bf16)
ZRT_INSTANTIATE(fp16)
#undef ZRT_INSTANTIATE

}  // namespace zrt::kernels::cpu
