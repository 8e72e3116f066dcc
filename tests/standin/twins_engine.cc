// Twins of the engine's CUDA kernels (runtime/engine/engine_kernels.cu): the CPU twins in
// engine_kernels.cc, on the same type codes (0 fp32, 1 bf16, 2 fp16).
#include "runtime/common/dtype.h"
#include "runtime/engine/engine_kernels.h"
#include "tests/standin/kernel_twins.h"

namespace zrt::standin {

namespace {

const std::string kNs = "zrt::engine_kernels::cuda::(anonymous namespace)::";

DType type_of(KernelCall& k, int code, const char* arg) {
  k.require(code >= 0 && code <= 2, fmt::format("{} = {} is not a type code (0, 1, 2)", arg, code));
  return code == 0 ? DType::kFloat32 : code == 1 ? DType::kBFloat16 : DType::kFloat16;
}

std::int64_t bytes_of(DType t, std::int64_t n) {
  return n * static_cast<std::int64_t>(dtype_size(t));
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
  twin<void*, int, long, float>(kNs + "scale_kernel(void*, int, long, float)",
                                [](KernelCall& k, void* x, int t, long n, float factor) {
                                  const DType d = type_of(k, t, "type");
                                  k.writes(x, bytes_of(d, n), "x");
                                  k.run([=] { engine_kernels::cpu::scale(x, d, n, factor); });
                                });
  // One block of 1024 threads reduces everything (a second block would add the sum again).
  twin<const void*, int, long, float*>(
      kNs + "sum_squares_kernel(void const*, int, long, float*)",
      [](KernelCall& k, const void* x, int t, long n, float* acc) {
        const DType d = type_of(k, t, "type");
        k.require_block(1024);
        k.require(k.grid().x == 1 && k.grid().y == 1 && k.grid().z == 1,
                  "must run as exactly one block (each block adds its sum to *acc)");
        k.reads(x, bytes_of(d, n), "x");
        k.writes(acc, sizeof(float), "acc");
        k.run([=] { *acc += static_cast<float>(engine_kernels::cpu::sum_squares(x, d, n)); });
      });
}

}  // namespace zrt::standin
