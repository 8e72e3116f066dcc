// Causal attention on cuDNN's fused flash-attention kernels (its SDPA forward and backward,
// built as graphs through NVIDIA's header-only cuDNN frontend), an alternative to zrt's own
// fused kernels that KernelOptions::cuda_attention_cudnn (ZRT_CUDA_ATTENTION=cudnn) asks for.
// The same contract as attention_forward / gqa_attention_forward (kernels/ops.h): out, each
// query row's natural log-sum-exp of its scaled scores (cuDNN's softmax "stats"), and a
// backward that adds dq, dk, dv to what those buffers hold. cuDNN reads q, k, v and out where the
// models keep them (strided (B, heads, T, hs) views of GPT-2's (B,T,3C) qkv or of Llama's
// (B,T,heads,hs) tensors) and writes the gradients straight into dq, dk, dv when the caller
// promises they hold zeros (GradWrite::kIntoZeros, as the models do), else into workspace, which
// one element-wise pass adds in (cuDNN's outputs overwrite).
//
// bf16/fp16 only, the causal mask and, with a sliding window, the band's left bound (no packed
// documents: those calls, windowed or not, take zrt's kernels). Each
// shape's graphs are built once per KernelContext, on first use (cuDNN may compile kernels at
// run time: a few hundred ms) and kept; a shape cuDNN declines is remembered, logged once with
// cuDNN's reason, and runs on zrt's kernels. The backward is deterministic unless
// KernelOptions::cuda_attention_cudnn_deterministic is off (ZRT_CUDA_ATTENTION=
// cudnn-nondeterministic: cuDNN's faster backward, which sums dQ with atomics).
//
// Built only where the cuDNN frontend's headers were found at configure time
// (tools/install-cudnn-frontend) and never against the CUDA stand-ins; elsewhere every call
// returns false and cudnn_attention_built() says so.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/kernel_context.h"
#include "runtime/common/dtype.h"

namespace zrt::kernels::cuda {

// Whether this build has cuDNN attention.
bool cudnn_attention_built();
// What a build without it lacks and how to get it, for errors and logs.
std::string cudnn_attention_missing_reason();

// Where q, k, v (and out, and the gradients) lie: GPT-2's packed (B,T,3C) qkv with out (B,T,C),
// or Llama's q, out (B,T,NH,hs) and k, v (B,T,NKV,hs).
enum class QkvLayout { kPacked, kSeparate };

struct CudnnAttentionShape {
  DType dtype = DType::kBFloat16;
  int B = 0, T = 0, NH = 0, NKV = 0, hs = 0;
  QkvLayout layout = QkvLayout::kSeparate;
  bool deterministic = true;  // the backward's algorithm
  int window = 0;  // sliding window (kernels/ops.h; cuDNN's diagonal band left bound); 0: none
  // The workspace zrt's kernels would ask for this pass: a graph over
  // KernelOptions::cuda_attention_cudnn_workspace_limit is declined only when that is less.
  std::int64_t own_workspace = 0;
};

// Whether cuDNN attention may be asked for this call at all: the build has it, storage is
// bf16 or fp16 and no packed documents (`masked`, which zrt's fused kernels take; a sliding window
// goes to cuDNN as its diagonal band's left bound: CudnnAttentionShape::window). Whether cuDNN then
// takes the shape is known once its graph is built (the calls below).
bool cudnn_attention_may_take(const KernelOptions& options, DType dtype, bool masked);

// What the cuDNN frontend's own checks (dimensions, strides, data types, the attention's
// attributes, its support surface for compute capability `sm_version`, e.g. 90 for H100) say of
// the graph of one pass at this shape, without a device: empty when it passes, else the
// frontend's message (in a build without cuDNN attention, why it is absent). Whether cuDNN's
// engines then take it is for a device to say.
std::string cudnn_attention_validate(const CudnnAttentionShape& shape, bool backward,
                                     int sm_version);

// Enqueue the forward / backward on ctx's stream and return true, or return false with nothing
// enqueued when cuDNN does not take the shape. Pointers are device pointers; for kPacked, q is
// qkv and k, v are ignored (they are q + C and q + 2C), likewise dq for dqkv. lse is fp32
// (B,NH,T).
bool cudnn_attention_forward(KernelContext& ctx, const CudnnAttentionShape& shape, void* out,
                             float* lse, const void* q, const void* k, const void* v);
// in_place: the gradients are not added to (GradWrite::kIntoZeros or kOverwrite), so cuDNN
// writes every element of dq, dk, dv straight into them; else into workspace, then added.
bool cudnn_attention_backward(KernelContext& ctx, const CudnnAttentionShape& shape, void* dq,
                              void* dk, void* dv, const void* dout, const void* q, const void* k,
                              const void* v, const void* out, const float* lse, bool in_place);

}  // namespace zrt::kernels::cuda
