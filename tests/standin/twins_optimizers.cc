// Twins of the fused CUDA optimizer kernel (optimizers/cuda/cuda_optimizer_kernels.cu), written
// once over the optimizer's Math (AdamMath, LionMath: the element update the kernels and the CPU
// optimizers use), over the device-resident slice table. The table is read when the kernel runs
// (it is copied there in stream order), so its checks run then too.
#include <cstring>
#include <vector>

#include "optimizers/cuda/cuda_optimizer_kernels.h"
#include "runtime/common/dtype.h"
#include "tests/standin/kernel_twins.h"

namespace zrt::standin {

namespace {

using zrt::detail::CudaOptimizerDesc;
using zrt::detail::kCudaOptimizerBlockElems;

template <typename U>
void update_slice(const CudaOptimizerDesc& d, const typename U::Scalars& s) {
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
    float p = d.param[i];
    float state[U::kStates];
    for (int k = 0; k < U::kStates; ++k) state[k] = d.state[k][i];
    U::element(p, g, state, s);
    d.param[i] = p;
    for (int k = 0; k < U::kStates; ++k) d.state[k][i] = state[k];
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

// `state_names`: the optimizer's states, in the order of the table's state[] pointers.
void check_slice(const CudaOptimizerDesc& d, int k, const std::vector<const char*>& state_names,
                 const std::string& call) {
  Runtime& rt = Runtime::get();
  std::lock_guard<std::mutex> lock(rt.mutex());
  const auto n = static_cast<std::size_t>(d.numel);
  const std::size_t g = d.grad_kind == 0 ? 4 : 2;
  const std::string what = fmt::format("{} (slice {})", call, k);
  rt.check_range(what, "param", d.param, n * 4, {MemKind::kDevice}, true);
  rt.check_range(what, "grad", d.grad, n * g, {MemKind::kDevice}, true);
  for (std::size_t i = 0; i < state_names.size(); ++i) {
    rt.check_range(what, state_names[i], d.state[i], n * 4, {MemKind::kDevice}, true);
  }
  if (d.out_kind != 0) {
    rt.check_range(what, "param_out", d.param_out, n * (d.out_kind == 1 ? 4 : 2),
                   {MemKind::kDevice}, true);
  }
}

template <typename Math>
void register_optimizer_twin(const char* kernel, std::vector<const char*> state_names) {
  using Scalars = typename Math::Scalars;
  twin<const CudaOptimizerDesc*, int, Scalars, const StepDecision*>(
      kernel, [state_names](KernelCall& k, const CudaOptimizerDesc* table, int count, Scalars s,
                            const StepDecision* decision) {
        k.require_block(256);
        k.require(count >= 1, fmt::format("count {} < 1", count));
        k.reads(table, static_cast<std::int64_t>(count) * sizeof(CudaOptimizerDesc), "table");
        if (decision != nullptr) k.reads(decision, sizeof(StepDecision), "decision");
        const unsigned blocks = k.grid().x;
        const std::string name = k.name();
        k.run([=]() mutable {
          // As the kernel: every block reads the decision first (read when it runs, like the
          // table), so nothing is written when the step does not apply.
          if (decision != nullptr) {
            if (decision->apply == 0) return;
            s.grad_scale = decision->grad_scale;
          }
          std::vector<CudaOptimizerDesc> t(table, table + count);
          std::int64_t expected = 0;
          for (int i = 0; i < count; ++i) {
            if (t[i].first_block != expected) {
              fail(cudaErrorLaunchFailure, name,
                   fmt::format("slice {} starts at block {}, expected {}", i, t[i].first_block,
                               expected));
            }
            expected += (t[i].numel + kCudaOptimizerBlockElems - 1) / kCudaOptimizerBlockElems;
            check_slice(t[i], i, state_names, name);
          }
          if (blocks < expected) {
            fail(cudaErrorLaunchFailure, name,
                 fmt::format("launch grid too small for its data: {} blocks, the table's {} "
                             "slices need {}",
                             blocks, count, expected));
          }
          for (const CudaOptimizerDesc& d : t) {
            Math::with_update(s, d.weight_decay != 0,
                              [&](auto update) { update_slice<decltype(update)>(d, s); });
          }
        });
      });
}

}  // namespace

void register_optimizer_twins() {
  register_optimizer_twin<AdamMath>(
      "void zrt::detail::(anonymous namespace)::optimizer_kernel<zrt::AdamMath>(zrt::detail::"
      "CudaOptimizerDesc const*, int, zrt::AdamMath::Scalars, zrt::StepDecision const*)",
      {"exp_avg", "exp_avg_sq"});
  register_optimizer_twin<LionMath>(
      "void zrt::detail::(anonymous namespace)::optimizer_kernel<zrt::LionMath>(zrt::detail::"
      "CudaOptimizerDesc const*, int, zrt::LionMath::Scalars, zrt::StepDecision const*)",
      {"exp_avg"});
}

}  // namespace zrt::standin
