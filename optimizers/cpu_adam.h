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

namespace zrt {

struct CpuAdamOptions {
  CpuIsa isa = CpuIsa::kAuto;  // kAuto: active_cpu_isa(); or force a path (tests, benchmarks);
                               // throws if this CPU cannot run it
  int num_threads = 0;         // 0: omp_get_max_threads()
};

class CpuAdam {
 public:
  explicit CpuAdam(const AdamOptions& options, const CpuAdamOptions& cpu = {});

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

  const AdamOptions& options() const { return options_; }
  CpuIsa isa() const { return isa_; }  // resolved, never kAuto
  int num_threads() const { return num_threads_; }

 private:
  AdamOptions options_;
  CpuIsa isa_;
  int num_threads_;
};

// Checks one slice (non-null pointers for numel > 0, supported dtypes); throws InvalidArgument
// naming slice `index`.
void validate_adam_slice(const AdamSlice& slice, std::size_t index);

namespace detail {
// Updates elements [begin, end) of `slice` with the given ISA's kernel (no threading).
void adam_range_scalar(const AdamSlice& slice, std::int64_t begin, std::int64_t end,
                       const AdamStepScalars& s);
void adam_range_avx2(const AdamSlice& slice, std::int64_t begin, std::int64_t end,
                     const AdamStepScalars& s);
void adam_range_avx512(const AdamSlice& slice, std::int64_t begin, std::int64_t end,
                       const AdamStepScalars& s);
}  // namespace detail

}  // namespace zrt
