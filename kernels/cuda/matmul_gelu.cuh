// The MLP's GELU fused into its GEMMs (CUDA twin of the composition in kernels/ops.h):
// forward, the first projection's cuBLASLt matmul with the GELU_AUX_BIAS epilogue (the bias, the
// pre-activation stored for the backward, and the GELU, in the GEMM's epilogue); backward, the
// second projection's input-gradient GEMM with the DGELU epilogue, so neither the GELU's output
// nor its gradient makes an extra pass over (N, 4C). Where cuBLASLt offers no algorithm (shapes,
// alignments, a bias-less layer) both fall back to the unfused kernels, which compute the same
// to rounding: matmul.cu and gelu.cu.
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"

namespace zrt::kernels::cuda {

// pre (N,OC) = inp (N,C) @ weight (C,OC) + bias; out (N,OC) = gelu(pre).
void matmul_gelu_forward(const Launch& l, DType dtype, void* out, void* pre, const void* inp,
                         const void* weight, const void* bias, int N, int C, int OC);

// For act = gelu(pre) (N,C) feeding out = act @ weight (C,OC) + bias:
//   dpre (N,C) = gelu'(pre) * (dout @ weight^T)      OVERWRITTEN
//   dweight += act^T @ dout, dbias += column sums of dout (as matmul_backward).
// `scratch` (N,C) holds dout @ weight^T on the unfused path. l.ws: matmul_backward_workspace.
void matmul_dgelu_backward(const Launch& l, DType dtype, DType grad_dtype, void* dpre,
                           void* scratch, void* dweight, void* dbias, const void* dout,
                           const void* act, const void* weight, const void* pre, int N, int C,
                           int OC);

}  // namespace zrt::kernels::cuda
