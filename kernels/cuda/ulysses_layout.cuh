// CUDA twin of kernels/cpu/ulysses_layout.h: the layout changes around Ulysses attention's
// all-to-alls (the CPU header defines the shapes and the math). One thread per output element.
#pragma once

#include "kernels/cuda/cuda_common.cuh"

namespace zrt::kernels::cuda {

void ulysses_scatter_heads(const Launch& l, DType dtype, void* out, const void* in, int sp, int B,
                           int Tl, int H, int Hd, int hs, int heads_per_rank, int group);
void ulysses_scatter_heads_backward(const Launch& l, DType dtype, void* din, const void* dout,
                                    int sp, int B, int Tl, int H, int Hd, int hs,
                                    int heads_per_rank, int group);
void ulysses_gather_sequence(const Launch& l, DType dtype, void* out, const void* in, int sp, int B,
                             int Tl, int Hd, int hs);
void ulysses_scatter_sequence(const Launch& l, DType dtype, void* out, const void* in, int sp,
                              int B, int Tl, int Hd, int hs);
void ulysses_gather_heads(const Launch& l, DType dtype, void* out, const void* in, int sp, int B,
                          int Tl, int Hd, int hs);

}  // namespace zrt::kernels::cuda
