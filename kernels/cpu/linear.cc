#include "kernels/cpu/linear.h"

#include "kernels/cpu/matmul.h"

namespace zrt::kernels::cpu {

template <typename S>
std::int64_t linear_forward_workspace(int N, int C, int OC) {
  return matmul_forward_workspace<S>(N, C, OC);
}

template <typename S>
std::int64_t linear_backward_workspace(int N, int C, int OC) {
  return matmul_backward_workspace<S>(N, C, OC);
}

template <typename S>
void linear_forward(S* out, const S* inp, const S* weight, const S* bias, int N, int C, int OC,
                    acc_t<S>* ws) {
  dense_forward<S>(out, inp, weight, bias, N, C, OC, ws, WeightLayout::kOutIn);
}

template <typename S, typename G>
void linear_backward(S* dinp, G* dweight, G* dbias, const S* dout, const S* inp, const S* weight,
                     int N, int C, int OC, acc_t<S>* ws, GradWrite dinp_write) {
  dense_backward<S, G>(dinp, dweight, dbias, dout, inp, weight, N, C, OC, ws, WeightLayout::kOutIn,
                       dinp_write);
}

#define ZRT_FWD(S)                                                   \
  template std::int64_t linear_forward_workspace<S>(int, int, int);  \
  template std::int64_t linear_backward_workspace<S>(int, int, int); \
  template void linear_forward<S>(S*, const S*, const S*, const S*, int, int, int, acc_t<S>*);
#define ZRT_BWD(S, G)                                                                          \
  template void linear_backward<S, G>(S*, G*, G*, const S*, const S*, const S*, int, int, int, \
                                      acc_t<S>*, GradWrite);
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
