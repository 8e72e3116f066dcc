#include <spdlog/spdlog.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cudnn_attention.h"
#include "kernels/cuda/gemm.cuh"
#include "runtime/common/error.h"
#include "runtime/device/cuda_device.h"
#include "runtime/device/device_access.h"

namespace zrt::kernels::cuda {

void check_cublas(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw Error(file, line,
              fmt::format("{} failed: {} (cuBLAS status {})", call, cublasGetStatusString(status),
                          static_cast<int>(status)));
}

CudaKernelState::~CudaKernelState() {
  if (lt != nullptr) {
    if (cublasStatus_t s = cublasLtDestroy(lt); s != CUBLAS_STATUS_SUCCESS) {
      spdlog::error("cublasLtDestroy failed: {}", cublasGetStatusString(s));
    }
  }
  if (blas != nullptr) {
    if (cublasStatus_t s = cublasDestroy(blas); s != CUBLAS_STATUS_SUCCESS) {
      spdlog::error("cublasDestroy failed: {}", cublasGetStatusString(s));
    }
  }
}

std::unique_ptr<CudaKernelState> make_cuda_kernel_state(Device& device, Stream& stream,
                                                        const KernelOptions& options) {
  // Asked for by name, cuDNN's attention must be there; under "auto" zrt's kernels stand in.
  if (options.cuda_attention_cudnn_required && !cudnn_attention_built()) {
    ZRT_THROW(InvalidArgument, "cuDNN attention was asked for (ZRT_CUDA_ATTENTION={}) but {}",
              options.cuda_attention_cudnn_deterministic ? "cudnn" : "cudnn-nondeterministic",
              cudnn_attention_missing_reason());
  }
  auto state = std::make_unique<CudaKernelState>();
  state->stream = cuda_stream_handle(stream);
  ZRT_CUBLAS_CHECK(cublasCreate(&state->blas));
  ZRT_CUBLAS_CHECK(cublasSetStream(state->blas, state->stream));
  // Plain fp32 math for fp32 GEMMs (no TF32), so fp32 results track the CPU twins.
  ZRT_CUBLAS_CHECK(cublasSetMathMode(state->blas, CUBLAS_DEFAULT_MATH));
  ZRT_CUBLAS_CHECK(cublasLtCreate(&state->lt));
  if (options.cublaslt_workspace_bytes > 0) {
    state->lt_workspace = device.allocate(options.cublaslt_workspace_bytes, MemCategory::kWorkspace,
                                          "cuBLASLt workspace", MemorySpace::kDevice, &stream);
  }
  return state;
}

std::string describe_fused_paths(const CudaKernelState& state) {
  const auto names = [](unsigned bits) {
    std::string out;
    for (int e = 0; e < kLtEpilogues; ++e) {
      if ((bits & (1u << e)) == 0) continue;
      out += fmt::format("{}{}", out.empty() ? "" : ", ",
                         lt_epilogue_name(static_cast<LtEpilogue>(e)));
    }
    return out.empty() ? std::string("none") : out;
  };
  std::string text = fmt::format("cuBLASLt epilogues fused: {}", names(state.lt_fused_epilogues));
  if (state.lt_declined_epilogues != 0) {
    text += fmt::format("; declined for some shape (the unfused kernels ran): {}",
                        names(state.lt_declined_epilogues));
  }
  if (state.lt_refused_epilogues != 0) {
    text +=
        fmt::format("; failed (the unfused kernels run): {}", names(state.lt_refused_epilogues));
  }
  // Where cuDNN's attention is in play (its state made): how many of the calls it took.
  if (state.cudnn_attention != nullptr || state.cudnn_attention_forwards > 0) {
    text += fmt::format("; cuDNN attention: {} forward, {} backward passes",
                        state.cudnn_attention_forwards, state.cudnn_attention_backwards);
  }
  return text;
}

Launch make_launch(CudaKernelState& state, void* ws) {
  Launch l;
  l.stream = state.stream;
  l.blas = state.blas;
  l.lt = state.lt;
  if (!state.lt_workspace.empty()) {
    l.lt_workspace = device_access::raw(state.lt_workspace.device<std::byte>());
    l.lt_workspace_bytes = static_cast<std::size_t>(state.lt_workspace.bytes());
  }
  l.ws = ws;
  l.state = &state;
  return l;
}

cudaDataType to_cuda_dtype(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return CUDA_R_32F;
    case DType::kBFloat16:
      return CUDA_R_16BF;
    case DType::kFloat16:
      return CUDA_R_16F;
    default:
      break;
  }
  ZRT_THROW(InvalidArgument, "no CUDA floating type for dtype {}", dtype_name(dtype));
}

}  // namespace zrt::kernels::cuda
