// The SwiGLU MLP (down(silu(x gate^T) * x up^T)) over a pass's rows in tiles (ALST's TiledMLP):
// a tile's gate, up and h and their gradients live for that tile only, and the backward computes a
// tile's gate, up and h again before its gradients, so the MLP's (rows, I) tensors stop growing
// with the sequence. How many rows a tile takes: tiling.h. Shared by the Llama family's blocks and
// the dense layers of the mixtures of experts, which plan the tile's tensors in their layouts.
#pragma once

#include <cstdint>

#include "kernels/kernel_context.h"
#include "runtime/common/dtype.h"
#include "runtime/device/device_ptr.h"

namespace zrt::transformer {

// The MLP's three projections (or their gradients): gate (I,C), up (I,C), down (C,I).
struct SwigluWeights {
  DevicePtr<std::byte> gate, up, down;
};

// The rows a tile of the MLP of width I takes for a pass of N rows (`S` bytes an element) under
// `setting` (model.tiling.mlp_rows; tiling.h's rule over its six (rows, I) tensors: gate, up, h,
// dh, dgate, dup), N when whole.
int swiglu_tile_rows(int I, int setting, std::int64_t N, std::int64_t S);

// One tile's tensors, (rows, I) each: the forward's gate, up and h, and the backward's dh, dgate
// and dup (the backward zeroes dgate and dup per tile before swiglu_backward adds into them).
struct SwigluTile {
  int rows = 0;
  DevicePtr<std::byte> gate, up, h, dh, dgate, dup;
};

// out (N,C) = the MLP of x (N,C), a tile of rows at a time (OVERWRITTEN).
void swiglu_mlp_tiled_forward(kernels::KernelContext& ctx, DType dt, const SwigluWeights& w,
                              const SwigluTile& tile, DevicePtr<std::byte> x,
                              DevicePtr<std::byte> out, int N, int C, int I);
// dx (N,C) = the gradient into x (OVERWRITTEN) from dout (N,C), the MLP's output gradient; the
// weights' gradients g accumulate over the tiles.
void swiglu_mlp_tiled_backward(kernels::KernelContext& ctx, DType dt, DType gt,
                               const SwigluWeights& w, const SwigluWeights& g,
                               const SwigluTile& tile, DevicePtr<std::byte> x,
                               DevicePtr<std::byte> dout, DevicePtr<std::byte> dx, int N, int C,
                               int I);

}  // namespace zrt::transformer
