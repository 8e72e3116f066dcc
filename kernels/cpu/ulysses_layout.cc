#include "kernels/cpu/ulysses_layout.h"

#include <cstring>

namespace zrt::kernels::cpu {

namespace {

using I64 = std::int64_t;

// Copies `rows` runs of `run` elements: run r from src + r*src_stride to dst + r*dst_stride.
template <typename S>
void copy_runs(S* dst, I64 dst_stride, const S* src, I64 src_stride, I64 rows, I64 run) {
#pragma omp parallel for schedule(static)
  for (I64 r = 0; r < rows; ++r) {
    std::memcpy(dst + r * dst_stride, src + r * src_stride,
                static_cast<std::size_t>(run) * sizeof(S));
  }
}

}  // namespace

template <typename S>
void ulysses_scatter_heads(S* out, const S* in, int sp, int B, int Tl, int H, int Hd, int hs,
                           int heads_per_rank, int group) {
  const I64 rows = I64{B} * Tl;
  for (int j = 0; j < sp; ++j) {
    const int first = ulysses_first_head(j, heads_per_rank, group);
    copy_runs(out + j * rows * Hd * hs, I64{Hd} * hs, in + I64{first} * hs, I64{H} * hs, rows,
              I64{Hd} * hs);
  }
}

template <typename S>
void ulysses_scatter_heads_backward(S* din, const S* dout, int sp, int B, int Tl, int H, int Hd,
                                    int hs, int heads_per_rank, int group) {
  using A = acc_t<S>;
  const I64 rows = I64{B} * Tl;
#pragma omp parallel for schedule(static)
  for (I64 r = 0; r < rows; ++r) {
    for (int h = 0; h < H; ++h) {
      S* dst = din + (r * H + h) * hs;
      for (int x = 0; x < hs; ++x) {
        A sum = load<A>(dst[x]);
        for (int j = 0; j < sp; ++j) {
          const int first = ulysses_first_head(j, heads_per_rank, group);
          if (h < first || h >= first + Hd) continue;
          sum += load<A>(dout[((j * rows + r) * Hd + (h - first)) * hs + x]);
        }
        dst[x] = store<S>(sum);
      }
    }
  }
}

template <typename S>
void ulysses_gather_sequence(S* out, const S* in, int sp, int B, int Tl, int Hd, int hs) {
  // One run per (block, sequence): Tl*Hd*hs contiguous elements each side.
  const I64 run = I64{Tl} * Hd * hs;
  for (int i = 0; i < sp; ++i) {
    copy_runs(out + i * run, I64{sp} * run, in + I64{i} * B * run, run, B, run);
  }
}

template <typename S>
void ulysses_scatter_sequence(S* out, const S* in, int sp, int B, int Tl, int Hd, int hs) {
  const I64 run = I64{Tl} * Hd * hs;
  for (int i = 0; i < sp; ++i) {
    copy_runs(out + I64{i} * B * run, run, in + i * run, I64{sp} * run, B, run);
  }
}

template <typename S>
void ulysses_gather_heads(S* out, const S* in, int sp, int B, int Tl, int Hd, int hs) {
  const I64 rows = I64{B} * Tl;
  for (int i = 0; i < sp; ++i) {
    copy_runs(out + I64{i} * Hd * hs, I64{sp} * Hd * hs, in + i * rows * Hd * hs, I64{Hd} * hs,
              rows, I64{Hd} * hs);
  }
}

#define ZRT_INSTANTIATE(S)                                                                         \
  template void ulysses_scatter_heads<S>(S*, const S*, int, int, int, int, int, int, int, int);    \
  template void ulysses_scatter_heads_backward<S>(S*, const S*, int, int, int, int, int, int, int, \
                                                  int);                                            \
  template void ulysses_gather_sequence<S>(S*, const S*, int, int, int, int, int);                 \
  template void ulysses_scatter_sequence<S>(S*, const S*, int, int, int, int, int);                \
  template void ulysses_gather_heads<S>(S*, const S*, int, int, int, int, int);
ZRT_INSTANTIATE(float)
ZRT_INSTANTIATE(double)
ZRT_INSTANTIATE(bf16)
ZRT_INSTANTIATE(fp16)
#undef ZRT_INSTANTIATE

}  // namespace zrt::kernels::cpu
