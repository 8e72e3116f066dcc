// cuDNN attention's graphs (kernels/cuda/cudnn_attention.h) as the cuDNN frontend's own checks
// see them, on a machine without a GPU: every layout zrt hands cuDNN (GPT-2's packed qkv,
// Llama's grouped-query heads) at the models' shapes, forward and backward, must pass the
// frontend's validation of dimensions, strides, data types and attention attributes; and a graph
// the frontend must refuse is refused with its reason, so the check is not vacuous. Whether
// cuDNN's engines take a graph is a device's question: the GPU tests (test_cuda_kernels,
// test_cuda_llama_kernels) run them against the CPU twin. In a build without cuDNN attention
// the case says why and checks that the reason names the fix.
#include <catch2/catch.hpp>

#include <string>

#include "kernels/cuda/cudnn_attention.h"

using namespace zrt;
using zrt::kernels::cuda::cudnn_attention_built;
using zrt::kernels::cuda::cudnn_attention_missing_reason;
using zrt::kernels::cuda::cudnn_attention_validate;
using zrt::kernels::cuda::CudnnAttentionShape;
using zrt::kernels::cuda::QkvLayout;

TEST_CASE("cuDNN attention's graphs pass the cuDNN frontend's checks at the models' shapes",
          "[kernels][cudnn]") {
  if (!cudnn_attention_built()) {
    WARN("not checked: " << cudnn_attention_missing_reason());
    CHECK_FALSE(cudnn_attention_missing_reason().empty());
    return;
  }
  const CudnnAttentionShape shapes[] = {
      // GPT-2 124M at 8 x 1024 (12 heads of 64), packed (B,T,3C)
      {DType::kBFloat16, 8, 1024, 12, 12, 64, QkvLayout::kPacked, true},
      // head size 128, packed, fp16, an odd T
      {DType::kFloat16, 2, 200, 4, 4, 128, QkvLayout::kPacked, false},
      // Llama-3.1-8B at 2048 tokens: 32 query heads, 8 key/value heads of 128
      {DType::kBFloat16, 1, 2048, 32, 8, 128, QkvLayout::kSeparate, true},
      // multi-head in the separate layout, and a group of 8 at head size 64
      {DType::kBFloat16, 2, 192, 4, 4, 64, QkvLayout::kSeparate, false},
      {DType::kFloat16, 2, 192, 8, 1, 64, QkvLayout::kSeparate, true},
      // sliding windows (the diagonal band's left bound): Mistral-7B's 4096 at 8192 tokens, a
      // small one on GPT-2's packed layout
      {DType::kBFloat16, 1, 8192, 32, 8, 128, QkvLayout::kSeparate, true, 4096},
      {DType::kBFloat16, 2, 1024, 12, 12, 64, QkvLayout::kPacked, true, 100},
  };
  // A100, H100/H200, B200.
  for (const int sm : {80, 90, 100}) {
    for (const CudnnAttentionShape& s : shapes) {
      for (const bool backward : {false, true}) {
        INFO("sm_" << sm << " " << (backward ? "backward" : "forward") << " B=" << s.B
                   << " T=" << s.T << " heads " << s.NH << "/" << s.NKV << " hs " << s.hs
                   << (s.layout == QkvLayout::kPacked ? " packed" : " separate") << " window "
                   << s.window);
        const std::string reason = cudnn_attention_validate(s, backward, sm);
        INFO("the frontend says: " << reason);
        CHECK(reason.empty());
      }
    }
  }
}

TEST_CASE("a graph the cuDNN frontend must refuse is refused with its reason", "[kernels][cudnn]") {
  if (!cudnn_attention_built()) {
    WARN("not checked: " << cudnn_attention_missing_reason());
    return;
  }
  // 6 query heads cannot share 4 key/value heads: the frontend's grouped-query check.
  const CudnnAttentionShape bad{DType::kBFloat16, 1, 128, 6, 4, 64, QkvLayout::kSeparate, true};
  for (const bool backward : {false, true}) {
    const std::string reason = cudnn_attention_validate(bad, backward, 90);
    INFO((backward ? "backward: " : "forward: ") << reason);
    CHECK_FALSE(reason.empty());
  }
}
