// Which CUDA attention kernels a shape runs on, and the workspace each pass asks for: pure
// functions of the shapes and the KernelOptions, without CUDA, so that every build (a login
// node's zrt-mem without the CUDA toolkit included) plans a CUDA run's attention workspace as the
// CUDA backend allocates it. The kernels (attention.cuh, flash_attention.cuh,
// flash_attention_mma.cuh, gqa_attention.cuh) follow these rules; their headers include this one.
//
//   fused    bf16/fp16, head size 64 or 128 (the mma.sync kernels; the WMMA ones 64 only), T a
//            multiple of 64, as KernelOptions::cuda_fused_attention allows: no forward workspace,
//            the backward's (B,NH,T) fp32 row term
//   batched  everything else: q, k, v, y permuted to fp32 (4 B*T*C) and the (B,NH,T,T) scores;
//            the backward 7 B*T*C and two (B,NH,T,T)
//   grouped-query attention in place where the fused mma kernels take the shape (no packing);
//            else q and the repeated key/value heads packed into the (B,T,3C) layout first (the
//            backward packs the gradients too), then the attention's own workspace after it
#pragma once

#include <cstdint>
#include <string>

#include "kernels/kernel_context.h"
#include "runtime/common/dtype.h"

namespace zrt::kernels::cuda {

// The fused kernels' query/key tile (T must be a multiple) and the WMMA kernels' head size.
constexpr int kFlashTile = 64;
constexpr int kFlashWmmaHeadSize = 64;

// The implementations of the fused kernels: kMma (flash_attention_mma.cuh, the default), the same
// kernels pipelined, kMmaPipelined (the same shapes and results bit for bit), and kWmma
// (flash_attention.cuh: the WMMA API, head size 64 only; the second opinion the GPU tests use).
enum class FlashKernels { kMma, kMmaPipelined, kWmma };

// The attention kernels a context asks for: which shapes run on the fused kernels
// (KernelOptions::cuda_fused_attention), where the WMMA kernels take the shape (head size 64),
// whether on them (KernelOptions::cuda_attention_wmma), whether the mma kernels run pipelined
// (KernelOptions::cuda_attention_pipelined), whether grouped-query attention packs
// (KernelOptions::cuda_gqa_packed), and whether cuDNN's attention goes first where it takes the
// call (KernelOptions::cuda_attention_cudnn, kernels/cuda/cudnn_attention.h; the rules below are
// then those of the calls it declines) within a workspace limit (0: none).
struct AttentionKernels {
  FusedAttention fused = FusedAttention::kAll;
  bool wmma = false;
  bool gqa_packed = false;
  bool pipelined = false;
  bool cudnn = false;
  bool cudnn_deterministic = true;
  std::int64_t cudnn_workspace_limit = 0;
};
AttentionKernels attention_kernels(const KernelOptions& options);

// Whether the head size C / NH is one the mma kernels are built for (64 or 128).
bool flash_mma_head_size_supported(int C, int NH);
// Whether `kernels` take this shape and storage type.
bool flash_attention_supported(DType dtype, int T, int C, int NH,
                               FlashKernels kernels = FlashKernels::kMma);
// Grouped-query attention in place on the mma kernels: what flash_attention_supported(kMma)
// takes at C = NH*hs, with NH a multiple of NKV.
bool flash_gqa_supported(DType dtype, int T, int NH, int NKV, int hs);
// The mma kernels' implementation `kernels` asks for: kMma, or kMmaPipelined.
inline FlashKernels mma_kernels(const AttentionKernels& kernels) {
  return kernels.pipelined ? FlashKernels::kMmaPipelined : FlashKernels::kMma;
}
// What `kernels` runs, in words, for a run's log: "fused mma.sync kernels (staged) at head
// sizes 64 and 128 (bf16/fp16, T a multiple of 64), batched cuBLAS GEMMs elsewhere", and so on.
std::string describe(const AttentionKernels& kernels);
// Whether `kernels` runs this shape and storage type on the fused kernels.
bool runs_fused(const AttentionKernels& kernels, DType dtype, int T, int C, int NH);
// Whether grouped-query attention runs in place for these shapes (else it packs).
bool gqa_runs_in_place(const AttentionKernels& kernels, DType dtype, int T, int NH, int NKV,
                       int hs);

// cuDNN attention's workspace request at one shape, for planning (zrt-mem): what cuDNN 9.19
// asked for on an H200 at every shape timed there, to the byte (B 1-8, T 1024-8192, 12 or 32 heads
// over 8-32 key/value heads, head size 64 and 128; BENCHMARKS.md): the forward 256 bytes; the
// deterministic backward B*NH*T*(2T+4) + 256, the non-deterministic B*NH*T*(4hs+4) + 256, each
// plus B*NH*T*hs*4 (an fp32 dQ-sized buffer) under grouped-query attention. Other cuDNN versions
// or GPUs may ask for other sizes: the run's memory tracker counts what they do.
std::int64_t cudnn_attention_workspace_estimate(int B, int T, int NH, int NKV, int hs,
                                                bool backward, bool deterministic);
// Whether cuDNN's attention takes a pass whose graph asks for `cudnn_bytes` of workspace where
// zrt's kernels would ask for `own_bytes`: always with no limit (0), else within the limit or,
// above it, where zrt's kernels would need more (their batched path's T^2 scratch).
bool cudnn_attention_within_limit(const AttentionKernels& kernels, std::int64_t cudnn_bytes,
                                  std::int64_t own_bytes);
// Whether planning counts cuDNN's attention for a call, as the calls choose it: `kernels` ask
// for it, bf16/fp16, no packed documents, its estimated workspace within the limit against
// zrt's kernels' `own_bytes` for the pass. A build without CUDA plans as if the CUDA build had
// cuDNN attention (tools/build installs its headers).
bool cudnn_attention_planned(const AttentionKernels& kernels, DType dtype, bool documents, int B,
                             int T, int NH, int NKV, int hs, bool backward, std::int64_t own_bytes);

// Workspace bytes of each pass (Launch::ws).
std::int64_t flash_attention_backward_workspace(int B, int T, int NH);
std::int64_t attention_forward_workspace(DType dtype, int B, int T, int C, int NH,
                                         const AttentionKernels& kernels = {});
std::int64_t attention_backward_workspace(DType dtype, int B, int T, int C, int NH,
                                          const AttentionKernels& kernels = {});
// The packed (B,T,3*NH*hs) qkv of grouped-query attention's packed path (256-byte rounded).
std::int64_t gqa_packed_bytes(DType dtype, int B, int T, int NH, int hs);
std::int64_t gqa_attention_forward_workspace(DType dtype, int B, int T, int NH, int NKV, int hs,
                                             const AttentionKernels& kernels = {});
std::int64_t gqa_attention_backward_workspace(DType dtype, int B, int T, int NH, int NKV, int hs,
                                              const AttentionKernels& kernels = {});

}  // namespace zrt::kernels::cuda
