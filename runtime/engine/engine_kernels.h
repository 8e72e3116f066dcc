// The few element-wise kernels the engine itself needs, stream-ordered on either backend:
// dtype conversion, accumulation, scaling, the squared L2 norm used by clipping and the
// overflow check, and the step's decision taken from that norm. CPU twins in engine_kernels.cc,
// CUDA in engine_kernels.cu (same math: fp32 arithmetic, round to nearest even on 16-bit stores;
// the norm accumulates in fp64).
#pragma once

#include <cstdint>

#include "runtime/common/dtype.h"
#include "runtime/device/device.h"
#include "runtime/engine/step_decision.h"

namespace zrt::engine_kernels {

// dst[i] = src[i] converted (n elements). src and dst may be the same buffer only if the types
// are equal (then it is a no-op).
void convert(Device& device, Stream& stream, DevicePtr<const std::byte> src, DType src_type,
             DevicePtr<std::byte> dst, DType dst_type, std::int64_t n);
// dst[i] += src[i] (in fp32, stored in dst's type).
void accumulate(Device& device, Stream& stream, DevicePtr<const std::byte> src, DType src_type,
                DevicePtr<std::byte> dst, DType dst_type, std::int64_t n);
// x[i] *= factor.
void scale(Device& device, Stream& stream, DevicePtr<std::byte> x, DType type, std::int64_t n,
           float factor);
// *acc += sum of x[i]^2 (computed in fp64, added in fp32). Non-finite inputs make it non-finite.
void add_sum_squares(Device& device, Stream& stream, DevicePtr<const std::byte> x, DType type,
                     std::int64_t n, DevicePtr<float> acc);

// dst[i] = src[i] for n floats, where dst is pinned host memory (Device::allocate, kPinnedHost)
// that the device writes with a kernel rather than a copy: a few words the host waits for that
// must not queue behind a large copy in the same direction (on CUDA, copies of one direction
// share a copy engine: the offload's sums of squares waited 1.4 ms behind GPT-2's 79 MB
// embedding going down; BENCHMARKS.md). The host reads dst after an event recorded later.
void store_to_pinned_host(Device& device, Stream& stream, DevicePtr<const float> src, float* dst,
                          std::int64_t n);

// *out = decide_step(*norm_squared, inputs) (step_decision.h): the step's global decision from
// the summed squared norm, taken where the norm is, so the host need not read it first.
void decide_step(Device& device, Stream& stream, DevicePtr<const float> norm_squared,
                 const StepDecisionInputs& inputs, DevicePtr<StepDecision> out);

// CPU twins on host pointers (exposed for tests and for the CUDA parity test).
namespace cpu {
void convert(const void* src, DType src_type, void* dst, DType dst_type, std::int64_t n);
// convert() on the host's OpenMP threads (host_pass_threads): for the engine's state at
// start-up and at a load, not inside stream work.
void convert_on_host_threads(const void* src, DType src_type, void* dst, DType dst_type,
                             std::int64_t n);
void accumulate(const void* src, DType src_type, void* dst, DType dst_type, std::int64_t n);
void scale(void* x, DType type, std::int64_t n, float factor);
double sum_squares(const void* x, DType type, std::int64_t n);
}  // namespace cpu

}  // namespace zrt::engine_kernels
