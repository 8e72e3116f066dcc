// Shared pieces of the CUDA kernels: the per-stream cuBLAS state, what a launcher receives,
// status checks with file:line, dtype mapping. Host-only declarations (includable from .cc).
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <library_types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "kernels/kernel_context.h"
#include "runtime/common/dtype.h"
#include "runtime/device/buffer.h"

namespace zrt::kernels::cuda {

// Throws zrt::Error naming the call, the cuBLAS status and file:line unless status is success.
void check_cublas(cublasStatus_t status, const char* call, const char* file, int line);

// cuDNN attention's handle and graphs (kernels/cuda/cudnn_attention.cc), made on first use.
struct CudnnAttentionState;

// The cuBLAS / cuBLASLt handles of one KernelContext, bound to its stream.
struct CudaKernelState {
  CudaKernelState() = default;
  ~CudaKernelState();
  CudaKernelState(const CudaKernelState&) = delete;
  CudaKernelState& operator=(const CudaKernelState&) = delete;

  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  cublasLtHandle_t lt = nullptr;
  Buffer lt_workspace;  // cuBLASLt matmul workspace (stream-ordered on `stream`)
  // cuBLASLt epilogues (bits of 1 << LtEpilogue) this cuBLASLt failed with an error rather than
  // declining the shapes: logged once, then left to the unfused kernels (kernels/cuda/gemm.cu).
  unsigned lt_refused_epilogues = 0;
  // The epilogues that have run fused at least once (same bits): the GPU tests check that the
  // fused path, not only its fallback, is what ran.
  unsigned lt_fused_epilogues = 0;
  // The epilogues cuBLASLt had no algorithm for at some shape (the unfused kernels ran there).
  unsigned lt_declined_epilogues = 0;
  // cuDNN attention (KernelOptions::cuda_attention_cudnn): its state, and the passes it has run
  // (the GPU tests check that cuDNN, not the kernels it falls back to, ran).
  std::shared_ptr<CudnnAttentionState> cudnn_attention;
  std::int64_t cudnn_attention_forwards = 0;
  std::int64_t cudnn_attention_backwards = 0;
};

std::unique_ptr<CudaKernelState> make_cuda_kernel_state(Device& device, Stream& stream,
                                                        const KernelOptions& options);

// What the fused paths did so far, for a run's log: the cuBLASLt epilogues that ran fused, were
// declined for some shape or failed, and cuDNN's attention passes.
std::string describe_fused_paths(const CudaKernelState& state);

// Everything a launcher needs: stream, handles, and the op's scratch (KernelContext::workspace,
// sized by the op's *_workspace function; null when it needs none).
struct Launch {
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* lt_workspace = nullptr;
  std::size_t lt_workspace_bytes = 0;
  void* ws = nullptr;
  CudaKernelState* state = nullptr;  // the context's, for what gemm_lt learns once
};

Launch make_launch(CudaKernelState& state, void* ws);

// CUDA_R_32F, CUDA_R_16BF or CUDA_R_16F for a floating DType.
cudaDataType to_cuda_dtype(DType dtype);

}  // namespace zrt::kernels::cuda

#define ZRT_CUBLAS_CHECK(call) ::zrt::kernels::cuda::check_cublas((call), #call, __FILE__, __LINE__)
// After a kernel launch: throws with the launch error and file:line.
#define ZRT_CUDA_LAUNCH_CHECK() ZRT_CUDA_CHECK(cudaGetLastError())
