// Limits of the mixture-of-experts kernels shared by the CPU and CUDA twins (kernels/moe_ops.h).
#pragma once

namespace zrt::kernels {

// The most experts one token may choose (top-k): the router's backward keeps a row's k slot
// gradients in registers (CUDA) or on the stack (CPU). Mixtral uses 2, Qwen3-MoE 8, DeepSeek-V3 8.
constexpr int kMoeMaxTopK = 64;

}  // namespace zrt::kernels
