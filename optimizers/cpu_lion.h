// CpuLion: Lion over host-memory slices in one pass per element (read param, grad, m; write
// param, m and optionally the compute-dtype copy), vectorized with the same runtime dispatch as
// CpuAdam (AVX-512, AVX2+F16C, portable) and split over OpenMP threads the same way. Every
// element's result depends only on its own inputs and every path performs the same IEEE
// operations (lion.h), so results are bit-identical across ISAs and thread counts.
//
// Thread-safety: step() may be called from any thread; concurrent calls must not share slices.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "optimizers/cpu_adam.h"  // CpuAdamOptions: the ISA and thread choice of both optimizers
#include "optimizers/lion.h"
#include "optimizers/optimizer_config.h"
#include "runtime/common/cpu_isa.h"
#include "runtime/engine/optimizer_interface.h"  // StepWrites

namespace zrt {

class CpuLion : public detail::CpuOptimizerBase<LionOptions> {
 public:
  explicit CpuLion(const LionOptions& options, const CpuAdamOptions& cpu = {})
      : CpuOptimizerBase(options, cpu, "CPU Lion") {}

  // Performs one Lion step with learning rate `lr` on every slice, in place, reading the
  // gradients multiplied by `grad_scale`. Blocks until done. Throws InvalidArgument for a
  // malformed slice or a non-finite grad_scale before touching any memory.
  void step(const LionSlice* slices, std::size_t count, double lr, double grad_scale = 1.0) const;
  void step(const std::vector<LionSlice>& slices, double lr, double grad_scale = 1.0) const {
    this->step(slices.data(), slices.size(), lr, grad_scale);
  }
};

// Checks one slice (non-null pointers for numel > 0, supported dtypes); throws InvalidArgument
// naming slice `index`.
void validate_lion_slice(const LionSlice& slice, std::size_t index);

namespace detail {
// Updates elements [begin, end) of a slice with one ISA's kernel (cpu_lion_kernels.cc).
using LionRangeKernel = void (*)(const LionSlice& slice, std::int64_t begin, std::int64_t end,
                                 const LionStepScalars& s);
LionRangeKernel lion_range_kernel(CpuIsa isa, StepWrites writes = StepWrites::kAll);
}  // namespace detail

}  // namespace zrt
