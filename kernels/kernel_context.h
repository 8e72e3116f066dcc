// KernelContext: what the kernels of one stream need besides their arguments — the device, the
// stream they are enqueued on, a stream-ordered scratch workspace and, on the CUDA backend, the
// cuBLAS / cuBLASLt handles bound to that stream. One per (device, stream); no globals.
//
// Not thread-safe: like its stream, a context is driven by one thread.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "runtime/device/buffer.h"
#include "runtime/device/device.h"

namespace zrt::kernels {

// CUDA backend: where attention runs on the fused tensor-core kernels
// (kernels/cuda/flash_attention.cuh) rather than batched cuBLAS GEMMs: kAll, every shape they
// take (head size 64 or 128); kHeadSize64, head size 64 only; kNone, batched GEMMs always (the
// reference the benchmarks time them against, and a way back that needs no rebuild should a
// fused kernel misbehave on some GPU).
enum class FusedAttention { kAll, kHeadSize64, kNone };

// The ZRT_CUDA_ATTENTION environment variable. "auto" (or unset or empty, the default): cuDNN's
// fused attention where the build has it and cuDNN takes the call, its deterministic backward
// only within kCudnnAttentionAutoWorkspaceLimit of workspace, and zrt's pipelined fused kernels
// elsewhere. "cudnn" and "cudnn-nondeterministic": cuDNN's attention required (a build without it
// throws) at any workspace, the pipelined kernels where it declines. "pipelined": zrt's pipelined
// fused kernels, no cuDNN. "fused": zrt's staged fused kernels (the pipelined ones' bits, slower),
// no cuDNN. "hs64": the staged kernels at head size 64 only. "batched": batched GEMMs always. Any
// other value throws InvalidArgument naming them.
FusedAttention fused_attention_from_env();
// Whether ZRT_CUDA_ATTENTION runs zrt's mma kernels pipelined (all but fused, hs64, batched).
bool attention_pipelined_from_env();
// Whether ZRT_CUDA_ATTENTION lets cuDNN's attention go first (auto, cudnn,
// cudnn-nondeterministic), whether it insists on it (cudnn, cudnn-nondeterministic), and whether
// its backward is the deterministic one (all but cudnn-nondeterministic).
bool attention_cudnn_from_env();
bool attention_cudnn_required_from_env();
bool attention_cudnn_deterministic_from_env();
// The most workspace cuDNN's attention may ask for under "auto" (0 under an explicit cudnn: no
// limit). Its deterministic backward's workspace grows with T^2 (2 bytes per score, measured
// B*NH*T*(2T+4) bytes with cuDNN 9.19 on an H200: 4.3 GB at one 8192-token sequence of 32 heads,
// 1.1 TB at 131072), so long sequences take zrt's kernels, whose workspace is linear.
inline constexpr std::int64_t kCudnnAttentionAutoWorkspaceLimit = std::int64_t{8} << 30;
std::int64_t attention_cudnn_workspace_limit_from_env();

struct KernelOptions {
  // OpenMP threads of the CPU kernels; 0 takes OpenMP's default (OMP_NUM_THREADS). Results do
  // not depend on it.
  int cpu_threads = 0;
  // cuBLASLt workspace (CUDA backend).
  std::int64_t cublaslt_workspace_bytes = std::int64_t{32} << 20;
  // CUDA backend: run fused attention on its WMMA kernels instead of the mma.sync ones where
  // they take the shape (head size 64; kernels/cuda/flash_attention.cuh). Same results up to
  // summation order; the GPU tests compare both with the CPU twin.
  bool cuda_attention_wmma = false;
  // CUDA backend: which shapes take the fused attention kernels (see FusedAttention).
  FusedAttention cuda_fused_attention = fused_attention_from_env();
  // CUDA backend: run the fused mma.sync attention kernels pipelined (the next tile's copy in
  // flight while one is computed, operands read with ldmatrix; flash_attention_mma.cuh) rather
  // than staged one tile at a time. The same results bit for bit (the GPU tests and
  // tools/gpu-selftest compare both); 1.4-1.6x faster on an H200 (BENCHMARKS.md).
  bool cuda_attention_pipelined = attention_pipelined_from_env();
  // CUDA backend: run causal attention on cuDNN's fused flash-attention kernels (through the
  // cuDNN frontend; kernels/cuda/cudnn_attention.h) where the build has them and cuDNN takes the
  // call: bf16/fp16 without packed documents, at the shapes its heuristics accept, within
  // cuda_attention_cudnn_workspace_limit. Everything else keeps the kernels chosen above. On by
  // default: 5x zrt's staged kernels and 1.5-1.9x PyTorch's flash SDPA at head size 128 on an
  // H200, the same losses as zrt's kernels within bf16's rounding (BENCHMARKS.md).
  bool cuda_attention_cudnn = attention_cudnn_from_env();
  // Whether cuDNN's attention was asked for by name: a KernelContext in a build without it then
  // throws, naming the fix, instead of running zrt's kernels.
  bool cuda_attention_cudnn_required = attention_cudnn_required_from_env();
  // cuDNN attention's backward: deterministic (the default: the same bits every run, as zrt's
  // own kernels) or cuDNN's faster one that sums dQ with atomics.
  bool cuda_attention_cudnn_deterministic = attention_cudnn_deterministic_from_env();
  // The most workspace bytes one cuDNN attention graph may ask for; a graph asking for more is
  // declined (logged once) and zrt's kernels run the call. 0: no limit.
  std::int64_t cuda_attention_cudnn_workspace_limit = attention_cudnn_workspace_limit_from_env();
  // CUDA backend: run grouped-query attention by packing q and its repeated key/value heads
  // into one (B,T,3C) tensor (6 x NH x hs elements a token of workspace in the backward) even
  // where the fused kernels read them in place (kernels/cuda/gqa_attention.cuh). The path
  // before the in-place one: the GPU tests compare both with the CPU twin.
  bool cuda_gqa_packed = false;
};

namespace cuda {
struct CudaKernelState;  // kernels/cuda/cuda_common.cuh
}

class KernelContext {
 public:
  // Binds the context to `stream` of `device`; both must outlive it. On the CUDA backend this
  // creates the cuBLAS and cuBLASLt handles (throws if that fails).
  KernelContext(Device& device, Stream& stream, KernelOptions options = {});
  ~KernelContext();
  KernelContext(const KernelContext&) = delete;
  KernelContext& operator=(const KernelContext&) = delete;

  Device& device() const { return device_; }
  Stream& stream() const { return stream_; }
  const KernelOptions& options() const { return options_; }

  // Scratch of at least `bytes` (MemCategory::kWorkspace) for work enqueued on stream() until
  // the next call. Growing it releases the old one stream-ordered, so work already enqueued
  // keeps its memory. Contents undefined.
  DevicePtr<std::byte> workspace(std::int64_t bytes);
  std::int64_t workspace_bytes() const { return workspace_.bytes(); }
  // The workspace's size after a request of `bytes` when it holds `current`: unchanged when
  // large enough, else the request or a quarter more than now, whichever is larger (so a slowly
  // growing sequence of requests does not reallocate often). Planning replays it (zrt-mem).
  static std::int64_t grown_workspace_bytes(std::int64_t current, std::int64_t bytes) {
    return bytes > current ? std::max(bytes, current + current / 4) : current;
  }

  // The CUDA backend's state (handles, cuBLASLt workspace); null on the CPU backend.
  cuda::CudaKernelState* cuda() const { return cuda_.get(); }

 private:
  Device& device_;
  Stream& stream_;
  KernelOptions options_;
  Buffer workspace_;
  std::unique_ptr<cuda::CudaKernelState> cuda_;
};

}  // namespace zrt::kernels
