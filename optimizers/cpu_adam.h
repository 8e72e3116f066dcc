// CpuAdam: Adam/AdamW over host-memory slices in one pass per element (read param, grad, m, v;
// write param, m, v and optionally the compute-dtype copy), vectorized with runtime dispatch
// (AVX-512, AVX2+F16C, or portable code that the compiler vectorizes for baseline x86-64 where
// it can: one binary runs on any x86-64) and split over OpenMP threads. Every element's result
// depends only on its own inputs and every path performs the same IEEE operations (adam.h), so
// results are bit-identical across ISAs and thread counts.
//
// Thread-safety: step() may be called from any thread; concurrent calls must not share slices.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "optimizers/adam.h"
#include "optimizers/optimizer_config.h"
#include "runtime/common/cpu_isa.h"
#include "runtime/engine/optimizer_interface.h"  // StepWrites

namespace zrt {

struct CpuAdamOptions {
  CpuIsa isa = CpuIsa::kAuto;  // kAuto: active_cpu_isa(); or force a path (tests, benchmarks);
                               // throws if this CPU cannot run it
  int num_threads = 0;         // 0: omp_get_max_threads()
};

namespace detail {

// What CpuAdam and CpuLion share: their hyper-parameters and the kernel choice (ISA, threads).
template <typename Options>
class CpuOptimizerBase {
 public:
  const Options& options() const { return options_; }
  CpuIsa isa() const { return isa_; }  // resolved, never kAuto
  int num_threads() const { return num_threads_; }

 protected:
  // Throws InvalidArgument naming `who` ("CPU Adam") if this machine cannot run cpu.isa.
  CpuOptimizerBase(const Options& options, const CpuAdamOptions& cpu, const char* who);

  Options options_;
  CpuIsa isa_;
  int num_threads_;
};

}  // namespace detail

class CpuAdam : public detail::CpuOptimizerBase<AdamOptions> {
 public:
  explicit CpuAdam(const AdamOptions& options, const CpuAdamOptions& cpu = {})
      : CpuOptimizerBase(options, cpu, "CPU Adam") {}

  // Performs Adam step `step` (1-based; drives the bias correction) with learning rate `lr` on
  // every slice, in place, reading the gradients multiplied by `grad_scale` (the engine's
  // 1 / (loss scale * clip factor), fused here instead of a separate pass). Blocks until done.
  // Throws InvalidArgument for a malformed slice (null pointer, unsupported dtype), step < 1 or
  // a non-finite grad_scale, before touching any memory.
  void step(const AdamSlice* slices, std::size_t count, std::int64_t step, double lr,
            double grad_scale = 1.0) const;
  void step(const std::vector<AdamSlice>& slices, std::int64_t step, double lr,
            double grad_scale = 1.0) const {
    this->step(slices.data(), slices.size(), step, lr, grad_scale);
  }
};

// Checks one slice (non-null pointers for numel > 0, supported dtypes); throws InvalidArgument
// naming slice `index`.
void validate_adam_slice(const AdamSlice& slice, std::size_t index);

namespace detail {
// Updates elements [begin, end) of a slice with one ISA's kernel (no threading): the kernel for
// `isa` (cpu_adam_kernels.cc).
using AdamRangeKernel = void (*)(const AdamSlice& slice, std::int64_t begin, std::int64_t end,
                                 const AdamStepScalars& s);
AdamRangeKernel adam_range_kernel(CpuIsa isa, StepWrites writes = StepWrites::kAll);
}  // namespace detail

}  // namespace zrt
