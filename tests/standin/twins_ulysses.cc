// Twins of Ulysses sequence parallelism's layout kernels (kernels/cuda/ulysses_layout.cu): each
// kernel is a whole op of the CPU backend, so the CPU twin in kernels/cpu/ulysses_layout.cc runs
// it. The kernels see rows = B*Tl, which is all the CPU twins' layouts depend on.
#include <algorithm>
#include <cstdint>

#include "kernels/cpu/ulysses_layout.h"
#include "runtime/common/dtype.h"
#include "tests/standin/kernel_twins.h"
#include "tests/standin/twin_names.h"

namespace zrt::standin {

namespace {

using I64 = std::int64_t;
using namespace twin_names;

template <typename S>
void register_storage() {
  const char* s = cuda_name<S>();
  const I64 ss = sizeof(S);
  twin<S*, const S*, long, int, int, int, int, int, int>(
      sig("void " + kNs +
              "ulysses_scatter_heads_kernel<$S>($S*, $S const*, long, int, int, int, int, int, "
              "int)",
          s),
      [ss](KernelCall& k, S* out, const S* in, long n, int rows, int H, int Hd, int hs, int hpr,
           int group) {
        const I64 block = I64{rows} * Hd * hs;
        k.require(block > 0 && n % block == 0, "n is not whole blocks of rows x Hd x hs");
        k.require_threads(std::min<I64>(n, 65535LL * 32 * 256), "n");
        const int sp = static_cast<int>(n / block);
        k.writes(out, n * ss, "out");
        k.reads(in, I64{rows} * H * hs * ss, "in");
        k.run([=] {
          kernels::cpu::ulysses_scatter_heads<S>(out, in, sp, 1, rows, H, Hd, hs, hpr, group);
        });
      });
  twin<S*, const S*, long, int, int, int, int, int, int, int>(
      sig("void " + kNs +
              "ulysses_scatter_heads_backward_kernel<$S>($S*, $S const*, long, int, int, int, "
              "int, int, int, int)",
          s),
      [ss](KernelCall& k, S* din, const S* dout, long n, int sp, int rows, int H, int Hd, int hs,
           int hpr, int group) {
        k.require(n == I64{rows} * H * hs, "n is not rows x H x hs");
        k.require_threads(std::min<I64>(n, 65535LL * 32 * 256), "n");
        k.writes(din, n * ss, "din");
        k.reads(dout, I64{sp} * rows * Hd * hs * ss, "dout");
        k.run([=] {
          kernels::cpu::ulysses_scatter_heads_backward<S>(din, dout, sp, 1, rows, H, Hd, hs, hpr,
                                                          group);
        });
      });
  for (const bool gather : {true, false}) {
    twin<S*, const S*, long, int, int, int, long>(
        sig("void " + kNs + "ulysses_sequence_kernel<$S, " + (gather ? "true" : "false") +
                ">($S*, $S const*, long, int, int, int, long)",
            s),
        [ss, gather](KernelCall& k, S* out, const S* in, long n, int sp, int B, int Tl, long E) {
          k.require(n == I64{B} * sp * Tl * E, "n is not B x sp x Tl x E");
          k.require_threads(std::min<I64>(n, 65535LL * 32 * 256), "n");
          k.writes(out, n * ss, "out");
          k.reads(in, n * ss, "in");
          const int e = static_cast<int>(E);
          k.run([=] {
            if (gather) {
              kernels::cpu::ulysses_gather_sequence<S>(out, in, sp, B, Tl, 1, e);
            } else {
              kernels::cpu::ulysses_scatter_sequence<S>(out, in, sp, B, Tl, 1, e);
            }
          });
        });
  }
  twin<S*, const S*, long, int, int, int, int>(
      sig("void " + kNs +
              "ulysses_gather_heads_kernel<$S>($S*, $S const*, long, int, int, int, int)",
          s),
      [ss](KernelCall& k, S* out, const S* in, long n, int sp, int rows, int Hd, int hs) {
        k.require(n == I64{rows} * sp * Hd * hs, "n is not rows x sp x Hd x hs");
        k.require_threads(std::min<I64>(n, 65535LL * 32 * 256), "n");
        k.writes(out, n * ss, "out");
        k.reads(in, n * ss, "in");
        k.run([=] { kernels::cpu::ulysses_gather_heads<S>(out, in, sp, 1, rows, Hd, hs); });
      });
}

}  // namespace

void register_ulysses_twins() {
  register_storage<float>();
  register_storage<bf16>();
  register_storage<fp16>();
}

}  // namespace zrt::standin
