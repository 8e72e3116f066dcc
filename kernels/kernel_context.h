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

// The ZRT_CUDA_ATTENTION environment variable: "fused" (or unset or empty) kAll, "hs64"
// kHeadSize64, "batched" kNone, "pipelined" kAll on the pipelined kernels (below), "cudnn" and
// "cudnn-nondeterministic" kAll behind cuDNN's attention (below); any other value throws
// InvalidArgument naming them.
FusedAttention fused_attention_from_env();
// Whether ZRT_CUDA_ATTENTION asks for the pipelined fused kernels ("pipelined").
bool attention_pipelined_from_env();
// Whether ZRT_CUDA_ATTENTION asks for cuDNN's attention ("cudnn" or "cudnn-nondeterministic"),
// and whether for its deterministic backward (all but "cudnn-nondeterministic").
bool attention_cudnn_from_env();
bool attention_cudnn_deterministic_from_env();

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
  // than staged one tile at a time. The same results bit for bit; the GPU tests compare both.
  // Off until a GPU has timed it against the staged kernels (BENCHMARKS.md).
  bool cuda_attention_pipelined = attention_pipelined_from_env();
  // CUDA backend: run causal attention on cuDNN's fused flash-attention kernels (through the
  // cuDNN frontend; kernels/cuda/cudnn_attention.h) where cuDNN takes the call: bf16/fp16
  // without packed documents, at the shapes its heuristics accept. Everything else keeps the
  // kernels chosen above. A KernelContext asking for it in a build without it throws, naming
  // the fix. Off until a GPU has checked and timed it (BENCHMARKS.md).
  bool cuda_attention_cudnn = attention_cudnn_from_env();
  // cuDNN attention's backward: deterministic (the default: the same bits every run, as zrt's
  // own kernels) or cuDNN's faster one that sums dQ with atomics.
  bool cuda_attention_cudnn_deterministic = attention_cudnn_deterministic_from_env();
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
