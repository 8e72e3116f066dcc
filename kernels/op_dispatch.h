// What every file of dispatching entry points (ops.cc, ulysses_ops.cc, ...) needs to enqueue a
// CPU twin or launch a CUDA kernel: raw pointers of a buffer, the storage-type switch, the CPU
// stream with the context's thread count, scratch, the CUDA launch. Internal to kernels/.
#pragma once

#include <omp.h>

#include <cstdint>
#include <functional>
#include <utility>

#include "kernels/kernel_context.h"
#include "kernels/ops.h"
#include "runtime/common/error.h"
#include "runtime/device/backend_dispatch.h"
#include "runtime/device/cpu_stream.h"
#include "runtime/device/device_access.h"

#if ZRT_HAVE_CUDA
#include "kernels/cuda/cuda_common.cuh"
#endif

namespace zrt::kernels::dispatch {

using device_access::raw;

template <typename T>
T* ptr(Bytes p) {
  return reinterpret_cast<T*>(raw(p));
}
template <typename T>
const T* ptr(ConstBytes p) {
  return reinterpret_cast<const T*>(raw(p));
}

// Calls fn(S{}) with S the storage type of `dtype`.
template <typename Fn>
void with_storage(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32:
      fn(float{});
      return;
    case DType::kBFloat16:
      fn(bf16{});
      return;
    case DType::kFloat16:
      fn(fp16{});
      return;
    default:
      ZRT_THROW(InvalidArgument, "kernels: unsupported activation/parameter dtype {}",
                dtype_name(dtype));
  }
}

// Calls fn(S{}, G{}) with the storage and gradient types.
template <typename Fn>
void with_storage_grad(DType dtype, DType grad_dtype, Fn&& fn) {
  check_dtypes(dtype, grad_dtype);
  with_storage(dtype, [&](auto s) {
    if (grad_dtype == DType::kFloat32) {
      fn(s, float{});
    } else {
      fn(s, s);
    }
  });
}

// The dispatch of every kernel is runtime/device/backend_dispatch.h's (runs_on_cpu first).
inline bool on_cpu(const KernelContext& ctx) {
  return runs_on_cpu(ctx.device());
}

// Enqueues fn on the context's CPU stream, with the context's OpenMP thread count.
inline void run_cpu(KernelContext& ctx, const char* what, std::function<void()> fn) {
  const int threads = ctx.options().cpu_threads;
  as_cpu_stream(ctx.stream(), what).enqueue([threads, fn = std::move(fn)] {
    if (threads > 0) omp_set_num_threads(threads);
    fn();
  });
}

// Scratch for a CPU twin that needs `count` elements of A (null when none).
template <typename A>
A* cpu_workspace(KernelContext& ctx, std::int64_t count) {
  if (count <= 0) return nullptr;
  return reinterpret_cast<A*>(raw(ctx.workspace(count * static_cast<std::int64_t>(sizeof(A)))));
}

#if ZRT_HAVE_CUDA
inline cuda::Launch launch(KernelContext& ctx, std::int64_t workspace_bytes = 0) {
  ZRT_CHECK(ctx.cuda() != nullptr, "kernel context of a {} device has no CUDA state",
            device_type_name(ctx.device().type()));
  void* ws = workspace_bytes > 0 ? raw(ctx.workspace(workspace_bytes)) : nullptr;
  return cuda::make_launch(*ctx.cuda(), ws);
}
#endif

}  // namespace zrt::kernels::dispatch
