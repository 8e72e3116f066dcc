// CUDA twin of kernels/cpu/moe_shared_gate.h: Qwen2-MoE's sigmoid-gated shared expert, one thread
// per row (the backward's dot runs in channel order, as the CPU twin's: the same bits run to run).
#pragma once

#include "kernels/cuda/cuda_common.cuh"

namespace zrt::kernels::cuda {

void moe_shared_gate_forward(const Launch& l, DType dtype, void* out, const void* s, const void* g,
                             int N, int C);
void moe_shared_gate_backward(const Launch& l, DType dtype, void* ds, void* dg, const void* dout,
                              const void* s, const void* g, int N, int C);

}  // namespace zrt::kernels::cuda
