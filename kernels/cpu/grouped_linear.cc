#include "kernels/cpu/grouped_linear.h"

#include <algorithm>

#include "kernels/cpu/linear.h"

namespace zrt::kernels::cpu {

namespace {
using I64 = std::int64_t;

int largest_expert(const std::int32_t* offsets, int E) {
  int rows = 0;
  for (int e = 0; e < E; ++e) rows = std::max(rows, offsets[e + 1] - offsets[e]);
  return rows;
}
}  // namespace

template <typename S>
std::int64_t grouped_linear_forward_workspace(const std::int32_t* offsets, int E, int IC, int OC) {
  return linear_forward_workspace<S>(largest_expert(offsets, E), IC, OC);
}

template <typename S>
std::int64_t grouped_linear_backward_workspace(const std::int32_t* offsets, int E, int IC, int OC) {
  return linear_backward_workspace<S>(largest_expert(offsets, E), IC, OC);
}

template <typename S>
void grouped_linear_forward(S* out, const S* inp, const S* weight, const std::int32_t* offsets,
                            int E, int IC, int OC, acc_t<S>* ws, std::int64_t weight_stride) {
  const I64 stride = weight_stride > 0 ? weight_stride : I64{OC} * IC;
  for (int e = 0; e < E; ++e) {
    const int rows = offsets[e + 1] - offsets[e];
    if (rows == 0) continue;
    linear_forward<S>(out + I64{offsets[e]} * OC, inp + I64{offsets[e]} * IC, weight + e * stride,
                      nullptr, rows, IC, OC, ws);
  }
}

template <typename S, typename G>
void grouped_linear_backward(S* dinp, G* dweight, const S* dout, const S* inp, const S* weight,
                             const std::int32_t* offsets, int E, int IC, int OC, acc_t<S>* ws,
                             GradWrite dinp_write, std::int64_t weight_stride) {
  const I64 stride = weight_stride > 0 ? weight_stride : I64{OC} * IC;
  for (int e = 0; e < E; ++e) {
    const int rows = offsets[e + 1] - offsets[e];
    if (rows == 0) continue;
    linear_backward<S, G>(dinp ? dinp + I64{offsets[e]} * IC : nullptr,
                          dweight ? dweight + e * stride : nullptr, nullptr,
                          dout + I64{offsets[e]} * OC, inp + I64{offsets[e]} * IC,
                          weight + e * stride, rows, IC, OC, ws, dinp_write);
  }
}

#define ZRT_FWD(S)                                                                                \
  template std::int64_t grouped_linear_forward_workspace<S>(const std::int32_t*, int, int, int);  \
  template std::int64_t grouped_linear_backward_workspace<S>(const std::int32_t*, int, int, int); \
  template void grouped_linear_forward<S>(S*, const S*, const S*, const std::int32_t*, int, int,  \
                                          int, acc_t<S>*, std::int64_t);
#define ZRT_BWD(S, G)                                                                        \
  template void grouped_linear_backward<S, G>(S*, G*, const S*, const S*, const S*,          \
                                              const std::int32_t*, int, int, int, acc_t<S>*, \
                                              GradWrite, std::int64_t);
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
