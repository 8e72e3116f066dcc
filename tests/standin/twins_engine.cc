// Twins of the engine's CUDA kernels (runtime/engine/engine_kernels.cu): the CPU twins in
// engine_kernels.cc, on the same type codes (0 fp32, 1 bf16, 2 fp16).
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "runtime/common/dtype.h"
#include "runtime/engine/engine_kernels.h"
#include "tests/standin/kernel_twins.h"
#include "tests/standin/twin_names.h"

namespace zrt::standin {

namespace {

using I64 = std::int64_t;
using twin_names::cuda_name;
using twin_names::ld;
const std::string kNs = "zrt::engine_kernels::cuda::(anonymous namespace)::";

DType type_of(KernelCall& k, int code, const char* arg) {
  k.require(code >= 0 && code <= 2, fmt::format("{} = {} is not a type code (0, 1, 2)", arg, code));
  return code == 0 ? DType::kFloat32 : code == 1 ? DType::kBFloat16 : DType::kFloat16;
}

std::int64_t bytes_of(DType t, std::int64_t n) {
  return n * static_cast<std::int64_t>(dtype_size(t));
}

// The squared norm's first pass, sum_squares_partials_kernel<S, W>: 16-byte packs of W
// elements (W = 1: any alignment), pack p summed by block (p mod gridDim.x*blockDim.x) /
// blockDim.x into partials[b] in fp64, the elements after the last whole pack by block 0. Its
// shared array holds 256 doubles, so the block must be exactly that.
// The partials' values, not their bits: the kernel sums each thread's elements in fp64 and
// reduces a block's threads as a tree, this twin block by block in pack order, so the two agree
// to fp64 rounding (the GPU tests compare with the CPU at 1e-6, and run against run bitwise).
template <typename S>
void register_sum_squares() {
  const I64 wide = static_cast<I64>(16 / sizeof(S));
  for (const I64 W : {wide, I64{1}}) {
    twin<const S*, long, double*>(
        fmt::format("void {}sum_squares_partials_kernel<{}, {}>({} const*, long, double*)", kNs,
                    cuda_name<S>(), W, cuda_name<S>()),
        [W](KernelCall& k, const S* x, long n, double* partials) {
          k.require_block(256);
          k.require(k.grid().y == 1 && k.grid().z == 1, "the grid must be one-dimensional");
          k.require(W == 1 || reinterpret_cast<std::uintptr_t>(x) % 16 == 0,
                    "16-byte packs need a 16-byte aligned x");
          const I64 blocks = k.grid().x, threads = k.block().x;
          k.reads(x, n * static_cast<I64>(sizeof(S)), "x");
          k.writes(partials, blocks * static_cast<I64>(sizeof(double)), "partials");
          k.run([=] {
            std::fill(partials, partials + blocks, 0.0);
            const auto squared = [](S v) {
              const double d = ld(v);
              return d * d;
            };
            const I64 count = n / W;
            for (I64 p = 0; p < count; ++p) {
              double pack = 0.0;
              for (I64 e = 0; e < W; ++e) pack += squared(x[p * W + e]);
              partials[(p % (blocks * threads)) / threads] += pack;
            }
            for (I64 i = count * W; i < n; ++i) partials[0] += squared(x[i]);
          });
        });
  }
}

}  // namespace

void register_engine_twins() {
  // Grid-stride loops: any grid covers n.
  twin<const void*, int, void*, int, long>(
      kNs + "convert_kernel(void const*, int, void*, int, long)",
      [](KernelCall& k, const void* src, int st, void* dst, int dt, long n) {
        const DType s = type_of(k, st, "src type"), d = type_of(k, dt, "dst type");
        k.reads(src, bytes_of(s, n), "src");
        k.writes(dst, bytes_of(d, n), "dst");
        k.run([=] { engine_kernels::cpu::convert(src, s, dst, d, n); });
      });
  twin<const void*, int, void*, int, long>(
      kNs + "accumulate_kernel(void const*, int, void*, int, long)",
      [](KernelCall& k, const void* src, int st, void* dst, int dt, long n) {
        const DType s = type_of(k, st, "src type"), d = type_of(k, dt, "dst type");
        k.reads(src, bytes_of(s, n), "src");
        k.writes(dst, bytes_of(d, n), "dst");
        k.run([=] { engine_kernels::cpu::accumulate(src, s, dst, d, n); });
      });
  twin<const float*, float*, long>(
      kNs + "store_to_host_kernel(float const*, float*, long)",
      [](KernelCall& k, const float* src, float* dst, long n) {
        k.reads(src, n * static_cast<std::int64_t>(sizeof(float)), "src");
        k.writes(dst, n * static_cast<std::int64_t>(sizeof(float)), "dst");
        k.run([=] { std::copy(src, src + n, dst); });
      });
  twin<void*, int, long, float>(kNs + "scale_kernel(void*, int, long, float)",
                                [](KernelCall& k, void* x, int t, long n, float factor) {
                                  const DType d = type_of(k, t, "type");
                                  k.writes(x, bytes_of(d, n), "x");
                                  k.run([=] { engine_kernels::cpu::scale(x, d, n, factor); });
                                });
  register_sum_squares<float>();
  register_sum_squares<bf16>();
  register_sum_squares<fp16>();
  // The second pass: one block adds `count` partials (one per thread, so blockDim.x >= count;
  // its shared array holds 512) and adds the total, rounded to fp32, to *acc.
  twin<const double*, int, float*>(
      kNs + "sum_partials_kernel(double const*, int, float*)",
      [](KernelCall& k, const double* partials, int count, float* acc) {
        k.require(k.grid().x == 1 && k.grid().y == 1 && k.grid().z == 1,
                  "must run as exactly one block (it adds its total to *acc)");
        k.require(count >= 1 && k.block().x >= static_cast<unsigned>(count) && k.block().x <= 512 &&
                      k.block().y == 1 && k.block().z == 1,
                  fmt::format("blockDim.x {} must cover count {} and be at most 512", k.block().x,
                              count));
        k.reads(partials, count * static_cast<std::int64_t>(sizeof(double)), "partials");
        k.writes(acc, sizeof(float), "acc");
        k.run([=] {
          double total = 0.0;
          for (int i = 0; i < count; ++i) total += partials[i];
          *acc += static_cast<float>(total);
        });
      });
  // The step's decision: one thread reads the summed squared norm and writes the decision.
  twin<const float*, StepDecisionInputs, StepDecision*>(
      kNs + "decide_step_kernel(float const*, zrt::StepDecisionInputs, zrt::StepDecision*)",
      [](KernelCall& k, const float* norm_squared, StepDecisionInputs inputs, StepDecision* out) {
        k.require(k.grid().x == 1 && k.grid().y == 1 && k.grid().z == 1 && k.block().x == 1 &&
                      k.block().y == 1 && k.block().z == 1,
                  "must run as exactly one thread");
        k.reads(norm_squared, sizeof(float), "norm_squared");
        k.writes(out, sizeof(StepDecision), "out");
        k.run([=] { *out = zrt::decide_step(*norm_squared, inputs); });
      });
}

}  // namespace zrt::standin
