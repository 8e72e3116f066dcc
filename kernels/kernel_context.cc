#include "kernels/kernel_context.h"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>

#include <spdlog/spdlog.h>

#include "kernels/cpu/gemm.h"
#include "runtime/common/error.h"
#include "runtime/device/backend_dispatch.h"

#if ZRT_HAVE_CUDA
#include "kernels/cuda/cuda_common.cuh"
#else
namespace zrt::kernels::cuda {
struct CudaKernelState {};
}  // namespace zrt::kernels::cuda
#endif

namespace zrt::kernels {

namespace {

std::string attention_env() {
  const char* env = std::getenv("ZRT_CUDA_ATTENTION");
  return env == nullptr ? std::string() : std::string(env);
}

bool names_cudnn(const std::string& value) {
  return value == "cudnn" || value == "cudnn-nondeterministic";
}

bool is_auto(const std::string& value) {
  return value.empty() || value == "auto";
}

}  // namespace

FusedAttention fused_attention_from_env() {
  const std::string value = attention_env();
  if (is_auto(value) || value == "fused" || value == "pipelined" || names_cudnn(value)) {
    return FusedAttention::kAll;
  }
  if (value == "hs64") return FusedAttention::kHeadSize64;
  if (value == "batched") return FusedAttention::kNone;
  ZRT_THROW(InvalidArgument,
            "ZRT_CUDA_ATTENTION={}: expected auto (the default: cuDNN's fused attention where "
            "the build has it and it takes the call, zrt's pipelined fused kernels elsewhere), "
            "cudnn (cuDNN's attention required, at any workspace), cudnn-nondeterministic (the "
            "same with cuDNN's faster, non-deterministic backward), pipelined (zrt's pipelined "
            "fused kernels, no cuDNN), fused (zrt's staged fused kernels), hs64 (the staged "
            "kernels at head size 64 only) or batched (batched GEMMs always)",
            value);
}

bool attention_pipelined_from_env() {
  const std::string value = attention_env();
  return is_auto(value) || value == "pipelined" || names_cudnn(value);
}

bool attention_cudnn_from_env() {
  const std::string value = attention_env();
  return is_auto(value) || names_cudnn(value);
}

bool attention_cudnn_required_from_env() {
  return names_cudnn(attention_env());
}

bool attention_cudnn_deterministic_from_env() {
  return attention_env() != "cudnn-nondeterministic";
}

std::int64_t attention_cudnn_workspace_limit_from_env() {
  return is_auto(attention_env()) ? kCudnnAttentionAutoWorkspaceLimit : 0;
}

KernelContext::KernelContext(Device& device, Stream& stream, KernelOptions options)
    : device_(device), stream_(stream), options_(options) {
  ZRT_CHECK(options_.cpu_threads >= 0, "cpu_threads must be >= 0, not {}", options_.cpu_threads);
  if (runs_on_cpu(device)) {  // the CPU kernels need no handles
    // Once per process: OpenBLAS running generic kernels on a CPU it does not know.
    static std::once_flag warned;
    std::call_once(warned, [] {
      if (const std::string why = cpu::blas_core_warning(); !why.empty()) spdlog::warn("{}", why);
    });
    return;
  }
#if ZRT_HAVE_CUDA
  cuda_ = cuda::make_cuda_kernel_state(device, stream, options_);
#else
  cuda_backend_missing("KernelContext");
#endif
}

KernelContext::~KernelContext() = default;

DevicePtr<std::byte> KernelContext::workspace(std::int64_t bytes) {
  if (bytes > workspace_.bytes()) {
    const std::int64_t grown = grown_workspace_bytes(workspace_.bytes(), bytes);
    workspace_.reset();  // stream-ordered release: work already enqueued keeps the memory
    workspace_ = device_.allocate(grown, MemCategory::kWorkspace, "kernel workspace",
                                  MemorySpace::kDevice, &stream_);
  }
  return workspace_.device<std::byte>();
}

}  // namespace zrt::kernels
