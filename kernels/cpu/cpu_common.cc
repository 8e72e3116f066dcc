#include "kernels/cpu/cpu_common.h"

namespace zrt::kernels::cpu {

template <typename S>
void convert_to_acc(acc_t<S>* dst, const S* src, std::int64_t n) {
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < n; ++i) dst[i] = load<acc_t<S>>(src[i]);
}

template <typename S>
void convert_from_acc(S* dst, const acc_t<S>* src, std::int64_t n) {
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < n; ++i) dst[i] = store<S>(src[i]);
}

template <typename S>
void accumulate_from_acc(S* dst, const acc_t<S>* src, std::int64_t n) {
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < n; ++i) dst[i] = store<S>(load<acc_t<S>>(dst[i]) + src[i]);
}

#define ZRT_INSTANTIATE(S)                                              \
  template void convert_to_acc<S>(acc_t<S>*, const S*, std::int64_t);   \
  template void convert_from_acc<S>(S*, const acc_t<S>*, std::int64_t); \
  template void accumulate_from_acc<S>(S*, const acc_t<S>*, std::int64_t);
ZRT_INSTANTIATE(float)
ZRT_INSTANTIATE(double)
ZRT_INSTANTIATE(bf16)
ZRT_INSTANTIATE(fp16)
#undef ZRT_INSTANTIATE

}  // namespace zrt::kernels::cpu
