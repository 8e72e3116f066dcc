// Twin of the fused CUDA Lion kernel (optimizers/cuda/cuda_lion.cu): the element update of
// optimizers/lion_math.h (the CPU Lion's), over the device-resident slice table, read and
// checked when the kernel runs (it is copied there in stream order).
#include <cstring>
#include <vector>

#include "optimizers/cuda/cuda_lion_kernel.h"
#include "runtime/common/dtype.h"
#include "tests/standin/kernel_twins.h"

namespace zrt::standin {

namespace {

using zrt::detail::CudaLionDesc;
using zrt::detail::kCudaLionBlockElems;

template <bool kDecay>
void update_slice(const CudaLionDesc& d, const LionStepScalars& s) {
  for (std::int64_t i = 0; i < d.numel; ++i) {
    float g = 0.0f;
    switch (d.grad_kind) {
      case 0:
        g = static_cast<const float*>(d.grad)[i];
        break;
      case 1:
        g = to_float(static_cast<const bf16*>(d.grad)[i]);
        break;
      default:
        g = to_float(static_cast<const fp16*>(d.grad)[i]);
        break;
    }
    float p = d.param[i], m = d.exp_avg[i];
    lion_update_element<kDecay>(p, g, m, s);
    d.param[i] = p;
    d.exp_avg[i] = m;
    switch (d.out_kind) {
      case 1:
        static_cast<float*>(d.param_out)[i] = p;
        break;
      case 2:
        static_cast<bf16*>(d.param_out)[i] = to_bf16(p);
        break;
      case 3:
        static_cast<fp16*>(d.param_out)[i] = to_fp16(p);
        break;
      default:
        break;
    }
  }
}

void check_slice(const CudaLionDesc& d, int k, const std::string& call) {
  Runtime& rt = Runtime::get();
  std::lock_guard<std::mutex> lock(rt.mutex());
  const auto n = static_cast<std::size_t>(d.numel);
  const std::size_t g = d.grad_kind == 0 ? 4 : 2;
  const std::string what = fmt::format("{} (slice {})", call, k);
  rt.check_range(what, "param", d.param, n * 4, {MemKind::kDevice}, true);
  rt.check_range(what, "grad", d.grad, n * g, {MemKind::kDevice}, true);
  rt.check_range(what, "exp_avg", d.exp_avg, n * 4, {MemKind::kDevice}, true);
  if (d.out_kind != 0) {
    rt.check_range(what, "param_out", d.param_out, n * (d.out_kind == 1 ? 4 : 2),
                   {MemKind::kDevice}, true);
  }
}

}  // namespace

void register_lion_twins() {
  twin<const CudaLionDesc*, int, LionStepScalars>(
      "zrt::detail::(anonymous namespace)::lion_kernel(zrt::detail::CudaLionDesc const*, int, "
      "zrt::LionStepScalars)",
      [](KernelCall& k, const CudaLionDesc* table, int count, LionStepScalars s) {
        k.require_block(256);
        k.require(count >= 1, fmt::format("count {} < 1", count));
        k.reads(table, static_cast<std::int64_t>(count) * sizeof(CudaLionDesc), "table");
        const unsigned blocks = k.grid().x;
        const std::string name = k.name();
        k.run([=] {
          std::vector<CudaLionDesc> t(table, table + count);
          std::int64_t expected = 0;
          for (int i = 0; i < count; ++i) {
            if (t[i].first_block != expected) {
              fail(cudaErrorLaunchFailure, name,
                   fmt::format("slice {} starts at block {}, expected {}", i, t[i].first_block,
                               expected));
            }
            expected += (t[i].numel + kCudaLionBlockElems - 1) / kCudaLionBlockElems;
            check_slice(t[i], i, name);
          }
          if (blocks < expected) {
            fail(cudaErrorLaunchFailure, name,
                 fmt::format("launch grid too small for its data: {} blocks, the table's {} "
                             "slices need {}",
                             blocks, count, expected));
          }
          for (const CudaLionDesc& d : t) {
            if (s.has_weight_decay && d.weight_decay != 0) {
              update_slice<true>(d, s);
            } else {
              update_slice<false>(d, s);
            }
          }
        });
      });
}

}  // namespace zrt::standin
