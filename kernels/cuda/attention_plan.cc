#include "kernels/cuda/attention_plan.h"

#include <string>

#include <fmt/format.h>

namespace zrt::kernels::cuda {

namespace {

using I64 = std::int64_t;

I64 round_up(I64 bytes) {
  return (bytes + 255) / 256 * 256;
}

}  // namespace

AttentionKernels attention_kernels(const KernelOptions& options) {
  return {options.cuda_fused_attention,
          options.cuda_attention_wmma,
          options.cuda_gqa_packed,
          options.cuda_attention_pipelined,
          options.cuda_attention_cudnn,
          options.cuda_attention_cudnn_deterministic,
          options.cuda_attention_cudnn_workspace_limit};
}

I64 cudnn_attention_workspace_estimate(int B, int T, int NH, int NKV, int hs, bool backward,
                                       bool deterministic) {
  if (!backward) return 256;
  const I64 rows = I64{B} * NH * T;  // query rows over all heads
  I64 bytes = deterministic ? rows * (2 * I64{T} + 4) : rows * (4 * I64{hs} + 4);
  if (NKV < NH) bytes += rows * hs * 4;
  return round_up(bytes) + 256;
}

bool cudnn_attention_within_limit(const AttentionKernels& kernels, I64 cudnn_bytes, I64 own_bytes) {
  return kernels.cudnn_workspace_limit <= 0 || cudnn_bytes <= kernels.cudnn_workspace_limit ||
         cudnn_bytes <= own_bytes;
}

bool cudnn_attention_planned(const AttentionKernels& kernels, DType dtype, bool documents, int B,
                             int T, int NH, int NKV, int hs, bool backward, I64 own_bytes) {
  if (!kernels.cudnn || documents || (dtype != DType::kBFloat16 && dtype != DType::kFloat16)) {
    return false;
  }
  // Each pass's graph is held to the limit on its own: a backward over it runs on zrt's kernels
  // after cuDNN's forward (both leave the same log-sum-exp).
  return cudnn_attention_within_limit(
      kernels,
      cudnn_attention_workspace_estimate(B, T, NH, NKV, hs, backward, kernels.cudnn_deterministic),
      own_bytes);
}

namespace {
std::string describe_own(const AttentionKernels& kernels);
}

std::string describe(const AttentionKernels& kernels) {
  if (!kernels.cudnn) return describe_own(kernels);
  const std::string limit =
      kernels.cudnn_workspace_limit > 0
          ? fmt::format(" and its workspace is at most {:.1f} GiB",
                        static_cast<double>(kernels.cudnn_workspace_limit) / (1 << 30))
          : std::string();
  return std::string("cuDNN's fused attention (") +
         (kernels.cudnn_deterministic ? "deterministic" : "non-deterministic") +
         " backward) for bf16/fp16 without packed documents where cuDNN takes the shape" + limit +
         "; otherwise " + describe_own(kernels);
}

namespace {
std::string describe_own(const AttentionKernels& kernels) {
  if (kernels.fused == FusedAttention::kNone) return "batched cuBLAS GEMMs for every shape";
  const std::string mma =
      std::string("fused mma.sync kernels (") + (kernels.pipelined ? "pipelined" : "staged") + ")";
  const std::string where = " (bf16/fp16, T a multiple of 64), batched cuBLAS GEMMs elsewhere";
  if (kernels.fused == FusedAttention::kHeadSize64) {
    return (kernels.wmma ? std::string("fused WMMA kernels") : mma) + " at head size 64" + where;
  }
  return (kernels.wmma ? "fused WMMA kernels at head size 64, " + mma + " at 128"
                       : mma + " at head sizes 64 and 128") +
         where;
}
}  // namespace

bool flash_mma_head_size_supported(int C, int NH) {
  return NH > 0 && C % NH == 0 && (C / NH == 64 || C / NH == 128);
}

bool flash_attention_supported(DType dtype, int T, int C, int NH, FlashKernels kernels) {
  const bool head_size = kernels == FlashKernels::kWmma ? NH > 0 && C == NH * kFlashWmmaHeadSize
                                                        : flash_mma_head_size_supported(C, NH);
  return (dtype == DType::kBFloat16 || dtype == DType::kFloat16) && head_size && T > 0 &&
         T % kFlashTile == 0;
}

bool flash_gqa_supported(DType dtype, int T, int NH, int NKV, int hs) {
  return NKV > 0 && NH % NKV == 0 && flash_attention_supported(dtype, T, NH * hs, NH);
}

bool runs_fused(const AttentionKernels& kernels, DType dtype, int T, int C, int NH) {
  switch (kernels.fused) {
    case FusedAttention::kNone:
      return false;
    case FusedAttention::kHeadSize64:
      if (NH <= 0 || C != 64 * NH) return false;
      break;
    case FusedAttention::kAll:
      break;
  }
  return flash_attention_supported(dtype, T, C, NH);
}

bool gqa_runs_in_place(const AttentionKernels& kernels, DType dtype, int T, int NH, int NKV,
                       int hs) {
  const int C = NH * hs;
  // The WMMA kernels read packed rows only.
  return !kernels.gqa_packed && runs_fused(kernels, dtype, T, C, NH) &&
         !(kernels.wmma && flash_attention_supported(dtype, T, C, NH, FlashKernels::kWmma)) &&
         flash_gqa_supported(dtype, T, NH, NKV, hs);
}

I64 flash_attention_backward_workspace(int B, int T, int NH) {
  return static_cast<I64>(B) * NH * T * static_cast<I64>(sizeof(float));
}

I64 attention_forward_workspace(DType dtype, int B, int T, int C, int NH,
                                const AttentionKernels& kernels) {
  if (runs_fused(kernels, dtype, T, C, NH)) return 0;
  return (4 * static_cast<I64>(B) * T * C + static_cast<I64>(B) * NH * T * T) *
         static_cast<I64>(sizeof(float));
}

I64 attention_backward_workspace(DType dtype, int B, int T, int C, int NH,
                                 const AttentionKernels& kernels) {
  if (runs_fused(kernels, dtype, T, C, NH)) return flash_attention_backward_workspace(B, T, NH);
  return (7 * static_cast<I64>(B) * T * C + 2 * static_cast<I64>(B) * NH * T * T) *
         static_cast<I64>(sizeof(float));
}

I64 gqa_packed_bytes(DType dtype, int B, int T, int NH, int hs) {
  return round_up(static_cast<I64>(B) * T * 3 * NH * hs * static_cast<I64>(dtype_size(dtype)));
}

I64 gqa_attention_forward_workspace(DType dtype, int B, int T, int NH, int NKV, int hs,
                                    const AttentionKernels& kernels) {
  if (gqa_runs_in_place(kernels, dtype, T, NH, NKV, hs)) return 0;
  return gqa_packed_bytes(dtype, B, T, NH, hs) +
         attention_forward_workspace(dtype, B, T, NH * hs, NH, kernels);
}

I64 gqa_attention_backward_workspace(DType dtype, int B, int T, int NH, int NKV, int hs,
                                     const AttentionKernels& kernels) {
  if (gqa_runs_in_place(kernels, dtype, T, NH, NKV, hs)) {
    return flash_attention_backward_workspace(B, T, NH);
  }
  return 2 * gqa_packed_bytes(dtype, B, T, NH, hs) +
         attention_backward_workspace(dtype, B, T, NH * hs, NH, kernels);
}

}  // namespace zrt::kernels::cuda
