// The second pass of the column sums (a norm's weight and bias gradients, a bias gradient): the
// first pass leaves one row of partial sums per chunk of rows, and a finish kernel adds each
// column's chunks into the gradient. A column's chunks are read kFinishSlices at a time, so
// many chunks (1024 for Qwen3's per-head q/k norms at 2048 tokens) do not cost a memory latency
// each, and in a fixed order, so the sums are deterministic. nvcc only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace zrt::kernels::cuda {

constexpr int kFinishColumns = 32;  // a block's columns (threadIdx.x)
constexpr int kFinishSlices = 16;   // the slices of each column's chunks (threadIdx.y)

inline dim3 finish_block() {
  return dim3(kFinishColumns, kFinishSlices);
}
inline unsigned finish_blocks(int C) {
  return static_cast<unsigned>((C + kFinishColumns - 1) / kFinishColumns);
}

// Column c = blockIdx.x * kFinishColumns + threadIdx.x: the sum of part[k * C + c] over
// k < chunks, slice y = threadIdx.y adding chunks y, y + kFinishSlices, ... in turn, then the
// slices added in order. The result is meaningful where threadIdx.y == 0 and c < C; every thread
// of the block calls it (it synchronizes the block), and `slice` (kFinishSlices rows of
// kFinishColumns floats of shared memory) may be reused by the next call.
__device__ __forceinline__ float finish_column_sum(const float* part, int chunks, int C,
                                                   float (*slice)[kFinishColumns]) {
  const int c = blockIdx.x * kFinishColumns + threadIdx.x;
  const int y = threadIdx.y;
  float sum = 0.0f;
  if (c < C) {
    for (int k = y; k < chunks; k += kFinishSlices) {
      sum += part[static_cast<std::int64_t>(k) * C + c];
    }
  }
  __syncthreads();  // a previous call's slices are read
  slice[y][threadIdx.x] = sum;
  __syncthreads();
  if (y != 0) return 0.0f;
  sum = 0.0f;
  for (int t = 0; t < kFinishSlices; ++t) sum += slice[t][threadIdx.x];
  return sum;
}

}  // namespace zrt::kernels::cuda
